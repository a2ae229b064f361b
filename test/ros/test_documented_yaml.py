"""Every parameter YAML block in README.md and docs/ loads as ``--params-file`` would load it.

A block copied from the docs into a params file is parsed by rcl's own YAML parser (a node
created with it as a command-line argument); a block for this node (``/**`` with this node's
parameters) is also declared and validated on top of the preset its section names, as the
node process does. A documented block that rcl refuses (an unquoted URL in a flow list) fails
here, not on a robot.
"""

from __future__ import annotations

from collections import Counter

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from doc_blocks import REPO_ROOT, doc_blocks  # noqa: E402
from rclpy.context import Context  # noqa: E402

from cosmos_reason_ros.ros.config import declare_and_load  # noqa: E402

pytestmark = [pytest.mark.ros]

# The preset a documented node block is applied on top of (its section says which).
_PRESET_OF = {"DEPLOYMENT.md": "remote_server"}


def yaml_blocks() -> list[tuple[str, str]]:
    """(``<doc>#<n>``, text) of every yaml block, numbered from 0 in each document."""
    numbered: Counter[str] = Counter()
    blocks = []
    for block in doc_blocks({"yaml"}):
        blocks.append((f"{block.doc}#{numbered[block.doc]}", block.source))
        numbered[block.doc] += 1
    return blocks


BLOCKS = yaml_blocks()


def test_the_docs_have_yaml_blocks_to_check():
    assert {name.split("#")[0] for name, _ in BLOCKS} >= {"README.md", "DEPLOYMENT.md"}


@pytest.mark.parametrize(("name", "text"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_documented_yaml_block_loads_as_a_params_file(tmp_path, name, text):
    block = tmp_path / "block.yaml"
    block.write_text(text, encoding="utf-8")
    args = ["--ros-args"]
    preset = _PRESET_OF.get(name.split("#")[0])
    if preset is not None:
        args += ["--params-file", str(REPO_ROOT / "config" / f"{preset}.yaml")]
    args += ["--params-file", str(block)]
    context = Context()
    rclpy.init(context=context, args=[])
    try:
        # rcl parses every --params-file when the node is created; a file it cannot parse
        # raises here ("Couldn't parse params file").
        node = rclpy.create_node("cosmos_reason", context=context, cli_args=args,
                                 use_global_arguments=False, start_parameter_services=False)
        try:
            if text.lstrip().startswith("/**:"):  # this node's parameters: declared, validated
                declare_and_load(node, argv=args)
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
