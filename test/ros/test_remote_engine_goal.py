"""A goal answered end to end by a real vLLM server, from a node on a Python without vLLM.

What only this proves: the node process on the Python 3.10 leg (Jazzy's cp310 rclpy wheels,
Humble's Python; vLLM has no build for it, so that venv has no engine of its own) serves a
real action goal -- DDS, the action server, a camera frame, the HTTP engine (``engine.kind:
openai``) against a real ``vllm`` OpenAI server running the tiny model -- and the result
carries the model's streamed answer. The server runs from another venv's Python (the first
distro's, which CI sets up before this leg starts), as a robot on Humble would reach a GPU
server.

Where this venv has vLLM itself (the 3.11 legs) the test is skipped: there ``test_node.py``
drives goals through the real engine and ``test_openai_http.py`` the HTTP engine against the
same server.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from node_process import NodeProcess, rgb_image_msg, scene  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from servers import free_port  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow, pytest.mark.every_python]

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 240.0
# A child running another venv's Python must not inherit this venv's loader and path settings
# (the ROS wheels' bootstrapper re-executes Python with LD_LIBRARY_PATH set for this venv).
_FOREIGN_ENV_DROP = ("LD_LIBRARY_PATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE", "PYTHONPATH",
                     "VIRTUAL_ENV", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "PYTHONHOME")


def vllm_python() -> str | None:
    """A Python with vLLM: ``$COSMOS_REASON_VLLM_PYTHON``, else the checkout's 3.11 venvs."""
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV_DROP}
    candidates = [os.environ.get("COSMOS_REASON_VLLM_PYTHON", "")]
    candidates += [str(REPO_ROOT / f".venv-{d}" / "bin" / "python") for d in ("kilted", "jazzy")]
    for python in filter(None, candidates):
        if Path(python).is_file() and subprocess.run(
                [python, "-c", "import importlib.util as u, sys; "
                 "sys.exit(u.find_spec('vllm') is None)"],
                env=env, capture_output=True, timeout=60).returncode == 0:  # bound: a probe
            return python
    return None


def tiny_model_dir() -> Path:
    """The cached tiny Qwen3-VL (built by a venv with torch: this one may have none)."""
    from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

    try:
        return ensure_tiny_model("qwen3_vl")
    except ImportError as e:  # no torch here and nothing cached: the other venv builds it
        pytest.skip(f"tiny model not cached and cannot be built here ({e}): run "
                    "make setup ROS_DISTRO=kilted first")


@pytest.fixture(scope="module")
def server():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this venv has vLLM: test_node.py and test_openai_http.py cover this here")
    python = vllm_python()
    if python is None:
        pytest.skip("no Python with vLLM found (set COSMOS_REASON_VLLM_PYTHON or run "
                    "make setup ROS_DISTRO=kilted)")
    model = tiny_model_dir()
    port = free_port()
    log = Path(tempfile.mkstemp(prefix=f"vllm_{port}_", suffix=".log")[1])
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV_DROP}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1")
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "4",
            "--reasoning-parser", "qwen3", "--disable-uvicorn-access-log"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        t0 = time.monotonic()

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm server exited ({proc.returncode}):\n"
                                   + log.read_text()[-4000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                            timeout=2) as r:  # bound: a probe
                    return r.status == 200
            except OSError:
                return False

        try:
            wait_until(healthy, SERVER_START_TIMEOUT_S, "vllm server healthy", poll_s=0.5)
        except AssertionError as error:
            raise TimeoutError(f"{error}:\n" + log.read_text()[-4000:]) from None
        print(f"\nvllm server ({python}) healthy after {time.monotonic() - t0:.1f}s")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=20)  # bound: then SIGKILL
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def test_goal_on_a_real_server_succeeds_from_a_node_without_vllm(server: str) -> None:
    node = NodeProcess("remote_server", {"engine.url": server, "engine.model": "tiny",
                                         "image.wait_s": 5.0})
    side = client = None
    try:
        node.wait_ready()
        side = SpunNode("remote_goal_camera")
        camera = side.node.create_publisher(Image, "/image", 10)
        client = ReasonClient()
        assert client.wait_for_server(DISCOVERY_S)
        assert side.wait_matched(camera), "the node's camera subscription was not found"
        for _ in range(5):  # a few fresh frames; the goal takes the latest
            camera.publish(rgb_image_msg(scene(320, 240), side.now_ns()))
            time.sleep(0.05)  # paces: a 20 fps camera
        result = client.ask("What is on the table?", max_tokens=12, timeout_s=NEVER_S)
        assert (result.status, result.error_code) == ("succeeded", ErrorCode.OK), \
            result.error_message
        assert result.answer  # streamed by the model (random weights: any text)
        assert result.message.header.frame_id == "camera"  # the frame's header came back
    finally:
        if client is not None:
            client.close()
        if side is not None:
            side.close()
        node.stop_cleanly()
