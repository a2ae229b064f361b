"""The README's Python example checks each result: a missing camera ends it with the error.

Fast tier: the README block runs in this process (exactly as printed) against the in-process
node on the scripted engine, with no camera frame published, so the node answers the first goal
NO_IMAGE. The example must stop there with a non-zero exit naming the code, not print an empty
line and exit 0. (That it runs through with a camera is test_client.py's real-tier test.)
"""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from fake_engine import answers_the_task  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from node_process import readme_python_example  # noqa: E402

from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = pytest.mark.ros


def test_the_readme_example_stops_with_the_error_when_the_camera_is_missing(capsys):
    n = InProcessNode(script=answers_the_task)  # no frame is ever published
    try:
        with pytest.raises(SystemExit) as stopped:
            exec(compile(readme_python_example(), "README.md", "exec"),  # noqa: S102
                 {"__name__": "__main__"})
        results = list(n.results)
    finally:
        n.close()
    # sys.exit(text): the text goes to stderr and the exit status is 1.
    assert isinstance(stopped.value.code, str), stopped.value.code
    assert stopped.value.code.startswith(f"ground: aborted {ErrorCode.NO_IMAGE.name}: ")
    assert capsys.readouterr().out == ""  # no empty answer printed as if it were one
    assert all(m.task == "ground" for m in results)  # it stopped before asking verify
