"""The planning phase: what a behaviour tree's tick and an agent's tool call cost on the node.

Each round, on fresh pictures (a new frame before each request, so none starts from a cached
image):

- ``behaviour``: a py_trees ``Ask`` (``planning/behaviours.py``) through the bench's
  ``ReasonClient``, ticked every ``TICK_PERIOD_S`` until its goal (``TICK_GOAL_TOKENS``
  tokens, so it runs long enough to be ticked many times) ends; each tick is timed (wall and
  thread CPU). The running ticks are the figure: the first (it submits the goal) and the last
  (it reads the result and writes the blackboard) are kept apart.
- ``action`` and ``mcp``: the ``ask`` tool of the MCP server (``planning/mcp_server.py``),
  called through the SDK's own client, and the same action goal sent directly (the goal the
  tool builds: its defaults, ``max_tokens`` short), in alternating order; end to end on the
  client's clock. The node generates exactly max_tokens (``limits.fixed_output_length``), so
  the paired difference is the tool call's overhead: JSON-RPC over the pipe, the server's
  argument validation and structured output, and its own action client.

``--planning-mcp stdio`` (the default) starts ``reason_mcp`` as an agent does (a child process
speaking MCP on stdin/stdout); ``inprocess`` serves the same tools in this process (the
protocol without the pipe and the second process; what the fast test uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import (
    CAMERAS_FRONT_SIZE,
    LENGTHS,
    NODE_ACTION,
    NODE_TOPIC,
    PROMPT,
    REPO_ROOT,
    picture,
    rotated,
    size_name,
)
from cosmos_reason_ros.core.stats import median, percentile

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench

TICK_PERIOD_S = 0.002  # between ticks: a fast tree; the tick's own cost does not depend on it
TICK_GOAL_TOKENS = LENGTHS["128"]
TOOL = "ask"
DEFAULT_ROUNDS = 20  # more than the device repeats: a median's 95 % interval needs 6 pairs
TOOL_TIMEOUT_S = 120.0  # the tool's timeout_s (and the goal's): a loaded CPU run is slow


def run(bench: Bench, results: Results) -> None:
    """Behaviour ticks, then tool calls against their goals, rounds interleaved."""
    assert bench.ros is not None
    size = CAMERAS_FRONT_SIZE if CAMERAS_FRONT_SIZE in bench.sizes else bench.sizes[0]
    deadline = bench.budget.phase_deadline("planning")
    wanted = bench.args.planning_rounds or bench.args.repeats or DEFAULT_ROUNDS
    rounds = asyncio.run(_rounds(bench, results, size, wanted, deadline))
    results.extra("planning", {"size": size_name(size), "tool": TOOL,
                               "mcp": bench.args.planning_mcp, **benchreport.planning_cost(
                                   results.data["samples"])})
    results.mode("planning", status="ran", rounds=rounds, wanted=wanted,
                 mcp=bench.args.planning_mcp)


async def _rounds(bench: Bench, results: Results, size: tuple[int, int], wanted: int,
                  deadline: float) -> int:
    client = bench.ros.client
    fields = {"size": size_name(size), "tool": TOOL}
    rounds = 0
    async with _mcp_client(bench.args.planning_mcp, client) as session:
        await session.list_tools()
        for r in range(-1, wanted):
            if r >= 1 and time.monotonic() > deadline:
                break
            _publish(bench, size)
            results.sample(phase="planning", mode="behaviour", round=r, warmup=r < 0,
                           **fields, **_behaviour_run(client))
            for path in rotated(["action", "mcp"], r):
                _publish(bench, size)
                out = await (_tool_call(session) if path == "mcp"
                             else _action_call(client))
                results.sample(phase="planning", mode=path, round=r, warmup=r < 0, **fields,
                               **out)
            rounds += r >= 0
    return rounds


def _publish(bench: Bench, size: tuple[int, int]) -> None:
    bench.publish_frame(["node"], picture(size[0], size[1], bench.next_seed()))


def _behaviour_run(client: Any, clock: Callable[[], float] = time.perf_counter
                   ) -> dict[str, Any]:
    """Tick one ``Ask`` until its goal ends; return the tick figures (microseconds)."""
    from py_trees.common import Status

    from cosmos_reason_ros.planning.behaviours import Ask

    ask = Ask("bench ask", PROMPT, client=client, max_tokens=TICK_GOAL_TOKENS, greedy=True,
              timeout_s=TOOL_TIMEOUT_S)
    running, cpu = [], []
    t_start = clock()
    ask.tick_once()  # initialise: submits the goal
    submit_us = (clock() - t_start) * 1e6
    last_us = float("nan")
    while ask.status == Status.RUNNING:
        time.sleep(TICK_PERIOD_S)
        t0, c0 = clock(), time.thread_time()
        ask.tick_once()
        c1, t1 = time.thread_time(), clock()
        if ask.status == Status.RUNNING:
            running.append((t1 - t0) * 1e6)
            cpu.append((c1 - c0) * 1e6)
        else:
            last_us = (t1 - t0) * 1e6
    e2e_s = clock() - t_start
    result = ask.result
    ok = result is not None and result.ok and bool(running)
    return {"ok": ok, "error": None if ok else f"{ask.status.value}: {ask.feedback_message}"
            + ("" if running else " (no running tick)"),
            "ticks": len(running), "tick_p50_us": median(running),
            "tick_p95_us": percentile(running, 95), "tick_max_us": max(running, default=0.0),
            "tick_cpu_p50_us": median(cpu), "submit_tick_us": submit_us,
            "result_tick_us": last_us, "e2e_s": e2e_s,
            "output_tokens": result.message.output_tokens if result is not None else None}


async def _action_call(client: Any) -> dict[str, Any]:
    """Send the goal the ``ask`` tool sends, directly; time it from submit to its result."""
    from cosmos_reason_ros.planning.behaviours import SOURCES

    goal = client.goal(PROMPT, "vqa", (), (), source=SOURCES["latest"],
                       timeout_s=TOOL_TIMEOUT_S, reasoning=False,
                       max_tokens=LENGTHS["short"])
    done: list[float] = []
    t0 = time.perf_counter()
    handle = client.submit(goal, server_timeout_s=TOOL_TIMEOUT_S)
    handle.future.add_done_callback(lambda _f: done.append(time.perf_counter()))
    try:
        result = await asyncio.wait_for(asyncio.wrap_future(handle.future), TOOL_TIMEOUT_S * 2)
    except Exception as e:  # noqa: BLE001 - one failed request is a sample, not a crash
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    t1 = done[0] if done else time.perf_counter()
    return {"ok": result.ok, "error": None if result.ok else
            f"{result.error_code.name}: {result.error_message}", "e2e_s": t1 - t0,
            "node_total_s": result.message.total_s,
            "output_tokens": result.message.output_tokens}


async def _tool_call(session: Any) -> dict[str, Any]:
    """One ``ask`` tool call; timed from the call to its parsed result."""
    t0 = time.perf_counter()
    try:
        result = await session.call_tool(TOOL, {"question": PROMPT, "timeout_s": TOOL_TIMEOUT_S,
                                                "max_tokens": LENGTHS["short"]})
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    t1 = time.perf_counter()
    if result.is_error:
        text = result.content[0].text if result.content else "(no content)"
        return {"ok": False, "error": text[:300]}
    return {"ok": True, "error": None, "e2e_s": t1 - t0,
            "goal_id": (result.structured_content or {}).get("goal_id")}


@contextlib.asynccontextmanager
async def _mcp_client(kind: str, client: Any) -> Any:
    """Open an MCP client session with the tools: a ``reason_mcp`` child (stdio) or here."""
    import mcp

    if kind == "stdio":
        # The SDK passes a child only a few variables unless told: the ROS ones must reach it.
        params = mcp.StdioServerParameters(
            command=sys.executable, args=["-m", "cosmos_reason_ros.planning.mcp_server",
                                          "--action", NODE_ACTION, "--image-topic", NODE_TOPIC],
            cwd=str(REPO_ROOT), env=dict(os.environ))
        async with mcp.Client(params, read_timeout_seconds=TOOL_TIMEOUT_S * 2) as session:
            yield session
        return
    from cosmos_reason_ros.planning.mcp_server import CameraFeed, Tools, build_server

    feed = CameraFeed({"": NODE_TOPIC}, NODE_ACTION.rsplit("/", 1)[0])
    try:
        async with mcp.Client(build_server(Tools(client, feed)),
                              read_timeout_seconds=TOOL_TIMEOUT_S * 2) as session:
            yield session
    finally:
        feed.close()
