"""Every ``python`` block in README.md and docs/*.md runs against the node and does what it says.

Each block is found in the docs by its section heading and run, in this process, against the
real node on the scripted engine (``InProcessNode`` with ``answers_the_task``), reached by the
real names as a user's program reaches it: the node parameters and camera frames its section
describes, and a short preamble where the block is a fragment (it uses the ``client`` an
earlier block made). What each block prints (the scripted answer, the box numbers in pixels
of the camera's image) and the goals the node saw are checked, not only that it ran.

``RUNS`` says how to run each block; a block the table does not know fails
``test_every_python_block_in_the_docs_is_run``, saying which block and what to add, so no
documented example goes unexecuted. The stdio MCP block starts ``reason_mcp`` as the agent's
child process: that case is the real tier's (``slow``); every other case is fast.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import shutil
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from doc_blocks import DocBlock, doc_blocks  # noqa: E402
from fake_engine import Script, answers_the_task, request_text  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from waiting import NEVER_S, wait_until  # noqa: E402

from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]

VERDICT = {"answer": "yes", "reason": "The part is in the gripper."}  # answers_the_task's
PYTHON_FENCES = {"python", "py", "python3"}
MCP_TOOLS = {"ask", "ground", "point", "verify", "count", "cameras", "snapshot"}


# --- the blocks in the docs ----------------------------------------------------------------


BLOCKS = doc_blocks(PYTHON_FENCES)


# --- how each block is run -----------------------------------------------------------------


@dataclass
class Ran:
    """What a block did: its output, the exception that ended it, the names it left."""

    node: InProcessNode
    out: str = ""
    raised: BaseException | None = None
    trace: str = ""  # the traceback of ``raised``, for a failure's message
    names: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return self.out.splitlines()

    def tasks(self, goals: int) -> list[str]:
        """The tasks of the node's results, once the block's ``goals`` results are in (each
        reaches ``~/results``'s subscriber on its own schedule, after the goal's reply)."""
        wait_until(lambda: len(self.node.results) >= goals, NEVER_S, f"{goals} result(s)")
        return [m.task for m in self.node.results]


@dataclass(frozen=True)
class Run:
    """One way of running a block, and what it must then have done."""

    name: str  # the case, in the test id
    check: Callable[[Ran], None]  # asserts on what the block printed and the node saw
    script: Callable[[Any], Script] = answers_the_task  # the engine's answers
    params: dict[str, Any] = field(default_factory=dict)  # the node's, for this section
    frames: Callable[[InProcessNode], None] | None = None  # the camera frames before it runs
    preamble: str = ""  # for a fragment: what an earlier block set up (its `client`)
    teardown: str = ""  # run after the block, whatever happened (closes what preamble made)
    # Text of the block replaced before it runs, with why: (old, new_of(context)).
    replace: tuple[str, str] = ("", "")
    context: Callable[[InProcessNode], contextlib.AbstractContextManager[Any]] | None = None
    needs: tuple[str, ...] = ()  # modules the block imports (skipped without them)
    slow: bool = False  # starts a process: the real tier


def one_frame(n: InProcessNode) -> None:
    """One 64x48 frame on the default camera (the node takes a frame of any age)."""
    n.publish(width=64, height=48)
    n.wait_frames(1)


FRONT = {"width": 320, "height": 240, "frame_id": "front_optical"}
WRIST = {"width": 160, "height": 128, "frame_id": "wrist_optical"}


def part_in_each_camera(request: Any) -> Script:
    """A grounding answer for a goal about two cameras: one box in each, as the multi-camera
    prompt asks (answers_the_task's one box names no camera, so it would be in neither)."""
    if "Locate the bounding box" not in request_text(request):
        return answers_the_task(request)
    return Script(deltas=[json.dumps([  # Reason2 boxes: 0-1000 per axis of each camera's image
        {"bbox_2d": [100, 150, 400, 700], "label": "part", "camera": "front"},
        {"bbox_2d": [250, 500, 750, 1000], "label": "part", "camera": "wrist"}])])


def front_and_wrist(n: InProcessNode) -> None:
    """One frame per named camera, each its own size, at one stamp (a synchronized set)."""
    stamp = n.publish(camera="front", **FRONT)
    n.publish(stamp, camera="wrist", **WRIST)
    n.wait_frames(1, camera="front")
    n.wait_frames(1, camera="wrist")


# --- checks: what each block must have printed and asked -----------------------------------


def check_client_example(ran: Ran) -> None:
    # answers_the_task: box 100,150,400,700 of 0-1000 per axis, in the 64x48 frame's pixels.
    assert ran.raised is None, ran.trace
    [cup] = ran.names["cups"]
    assert (cup.label, cup.x_min, cup.y_min, cup.x_max, cup.y_max) == pytest.approx(
        ("red cup", 6.4, 7.2, 25.6, 33.6))
    assert ast.literal_eval(ran.out.strip()) == VERDICT  # the verdict, as JSON
    assert ran.tasks(2) == ["ground", "verify"]


def check_client_example_without_camera(ran: Ran) -> None:
    # No frame: the node answers NO_IMAGE, and the example stops there with the error
    # (sys.exit(text): stderr and exit status 1), never printing an empty answer.
    assert isinstance(ran.raised, SystemExit), repr(ran.raised)
    assert isinstance(ran.raised.code, str), ran.raised.code
    assert ran.raised.code.startswith(f"ground: aborted {ErrorCode.NO_IMAGE.name}: ")
    assert ran.out == ""
    assert ran.tasks(1) == ["ground"]  # it stopped before asking verify


def check_several_cameras(ran: Ran) -> None:
    # Each box in its own camera's pixels: front 320x240, wrist 160x128.
    assert ran.raised is None, ran.trace
    assert ran.lines() == ["front 32.0 36.0", "wrist 40.0 64.0"]
    assert ran.tasks(1) == ["ground"]
    [msg] = ran.node.results  # each camera's frame header, as the section says
    assert [(c.camera, c.header.frame_id) for c in msg.camera_frames] == [
        ("front", FRONT["frame_id"]), ("wrist", WRIST["frame_id"])]


def check_behaviour_tree(ran: Ran) -> None:
    # The scripted verdict is yes: the Selector ends at Verify, with its verdict and reason.
    assert ran.raised is None, ran.trace
    assert ran.lines() == [f"SUCCESS {VERDICT['answer']} {VERDICT['reason']}"]
    assert ran.tasks(1) == ["verify"]


def check_mcp_stdio(ran: Ran) -> None:
    assert ran.raised is None, ran.trace
    tools, verdict = ran.lines()
    assert set(ast.literal_eval(tools)) == MCP_TOOLS
    out = ast.literal_eval(verdict)
    assert (out["verdict"], out["reason"]) == (VERDICT["answer"], VERDICT["reason"])
    assert ran.tasks(1) == ["verify"]


def check_mcp_http(ran: Ran) -> None:
    assert ran.raised is None, ran.trace
    [box] = ast.literal_eval(ran.out.strip())
    assert (box["label"], box["position"]) == ("red cup", None)  # no depth: no 3D position
    assert (box["x_min"], box["y_min"], box["x_max"], box["y_max"]) == pytest.approx(
        (6.4, 7.2, 25.6, 33.6))
    assert ran.tasks(1) == ["ground"]


# --- the in-process MCP server for the HTTP block ------------------------------------------


@contextlib.contextmanager
def mcp_http_server(_n: InProcessNode) -> Iterator[str]:
    """``reason_mcp --transport http`` in this process, on a free loopback port; yield its
    ``host:port``. The same server ``main`` builds (``build_server`` over a ``ReasonClient``
    and the camera feed), served by uvicorn on a thread of its own."""
    import uvicorn

    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.planning.mcp_server import CameraFeed, Tools, build_server

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    feed = CameraFeed({"": "/image"})
    try:
        with ReasonClient() as client:
            app = build_server(Tools(client, feed)).streamable_http_app()
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                      name="mcp_http", daemon=True)
            thread.start()
            try:
                wait_until(lambda: server.started or not thread.is_alive(), NEVER_S,
                           "the MCP HTTP server started")
                assert server.started, "the MCP HTTP server ended at start"
                yield address
            finally:
                server.should_exit = True
                thread.join(NEVER_S)
                assert not thread.is_alive(), "the MCP HTTP server did not stop"
    finally:
        feed.close()
        sock.close()


# --- the table -----------------------------------------------------------------------------

CLIENT = "from cosmos_reason_ros.client import ReasonClient\n\nclient = ReasonClient()\n"

# Every python block of the docs, by "<document>: <section heading>", and how it is run.
RUNS: dict[str, tuple[Run, ...]] = {
    # The client example as printed: it must check each result (stop with the error).
    "README.md: Using it": (
        Run("with_camera", check_client_example, frames=one_frame),
        Run("without_camera", check_client_example_without_camera),
    ),
    # A fragment: `client` is the first block's.
    "README.md: Several cameras": (
        Run("front_and_wrist", check_several_cameras, script=part_in_each_camera,
            params={"cameras.names": ["front", "wrist"]}, frames=front_and_wrist,
            preamble=CLIENT, teardown="client.close()\n"),
    ),
    "README.md: Behaviour trees": (
        Run("verify_succeeds", check_behaviour_tree, frames=one_frame, needs=("py_trees",)),
    ),
    # The agent starts reason_mcp (on PATH from env-<distro>.sh) as its child process.
    "PLANNERS.md: stdio: the agent starts the server": (
        Run("reason_mcp_child", check_mcp_stdio, frames=one_frame, needs=("mcp",), slow=True),
    ),
    # The block connects to a running server: one in this process, on a port that is free
    # (8765, the documented one, may be taken on a shared machine).
    "PLANNERS.md: Streamable HTTP: one server, agents connect to it": (
        Run("served_here", check_mcp_http, frames=one_frame, needs=("mcp", "uvicorn"),
            context=mcp_http_server, replace=("127.0.0.1:8765", "{context}")),
    ),
}

CASES = [pytest.param(block, run, id=f"{block.doc}:{block.line}-{run.name}",
                      marks=[pytest.mark.slow] if run.slow else [])
         for block in BLOCKS for run in RUNS.get(block.key, ())]


def test_every_python_block_in_the_docs_is_run():
    unknown = [b for b in BLOCKS if b.key not in RUNS]
    assert not unknown, "\n".join(
        f"{b.doc}:{b.line}: the python block in section {b.heading!r} is never run: add "
        f"{b.key!r} to RUNS in test/test_documented_python.py (the node parameters and camera "
        f"frames its section needs, a preamble if it uses names an earlier block made, and a "
        f"check of what it prints)" for b in unknown)
    assert all(RUNS.values()), f"a block with no run: {[k for k, v in RUNS.items() if not v]}"
    stale = sorted(set(RUNS) - {b.key for b in BLOCKS})
    assert not stale, f"RUNS names python blocks the docs no longer have: {stale}"
    assert {b.doc for b in BLOCKS} >= {"README.md", "PLANNERS.md"}


@pytest.fixture
def behaviour_blackboard():
    """py_trees' blackboard is the process's: a block starts with it empty and leaves it so."""
    def clear() -> None:
        if "py_trees" in sys.modules:
            sys.modules["py_trees"].blackboard.Blackboard.clear()

    clear()
    yield
    clear()


@pytest.mark.parametrize(("block", "run"), CASES)
def test_documented_python_block_runs(block: DocBlock, run: Run, behaviour_blackboard):
    for module in run.needs:
        pytest.importorskip(module, reason=f"{block.key} needs {module} (make setup)")
    if run.slow and shutil.which("reason_mcp") is None:
        pytest.fail("reason_mcp is not on PATH: source env-<distro>.sh")
    n = InProcessNode(run.params, script=run.script)
    try:
        if run.frames is not None:
            run.frames(n)
        with (run.context(n) if run.context else contextlib.nullcontext("")) as value:
            ran = execute(block, run, n, value)
        run.check(ran)
    finally:
        n.close()


def execute(block: DocBlock, run: Run, n: InProcessNode, context: str) -> Ran:
    """Run the preamble, then the block as printed (``replace`` aside), then the teardown,
    in one namespace as one script would; return what it printed and how it ended."""
    old, new = run.replace
    source = block.source
    if old:
        assert old in source, f"{block.key}: {old!r} is no longer in the block: update RUNS"
        source = source.replace(old, new.format(context=context))
    # Blank lines before the block: a traceback names the document's line.
    code = compile("\n" * (block.line - 1) + source, block.doc, "exec")
    names: dict[str, Any] = {"__name__": "__main__"}
    ran = Ran(n, names=names)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            if run.preamble:
                exec(compile(run.preamble, f"{block.key} (preamble)", "exec"), names)  # noqa: S102
            try:
                exec(code, names)  # noqa: S102
            except (Exception, SystemExit) as e:  # noqa: BLE001 - the check decides
                ran.raised, ran.trace = e, traceback.format_exc()
        finally:
            if run.teardown:
                exec(compile(run.teardown, f"{block.key} (teardown)", "exec"), names)  # noqa: S102
    ran.out = out.getvalue()
    return ran
