"""Fault drills with real processes: bursts, mass cancel, timeouts, a silent camera, a dead
engine core, and a remote ``vllm`` server that is down at start, comes up, and is killed
mid-stream. Every drill checks that each goal ends with a specific outcome and that the node
keeps serving; it fails on an outcome, or on a figure above its hard bound. Each figure is
recorded (``record``: build/drills/report.md) against its target, met or missed; these are the
figures docs/RELIABILITY.md reports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from node_process import (  # noqa: E402
    ENDLESS_LIMITS,
    ENDLESS_SCHEMA,
    ENDLESS_TOKENS,
    NodeProcess,
    rgb_image_msg,
    scene,
)
from sensor_msgs.msg import Image  # noqa: E402
from servers import VllmServer, free_port  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: E402
from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow]

Goal = Reason.Goal
Feedback = Reason.Feedback
MAX_RUNNING, MAX_QUEUED = 50, 32
# The mass-cancel drill: 50 goals generating long answers (7 000 of 8 192 tokens of
# context, fixed output length), cancelled at once. The node logs each cancel request as it
# arrives; the drill prints both parts (delivery, then the node's and the engine's). The target
# is 2 s. Loaded CI runs took up to 4.8 s from the last arrival to an idle engine, and the
# delivery of the 50 requests up to 15.1 s (DDS reliable repair; docs/RELIABILITY.md, "Mass
# cancel"). So the drill's hard bounds: 10 s after the last arrival (a lost abort would go on
# generating its 7 000 tokens, 20 s or more here) and 30 s after the client's cancel (the
# minute-long stall that a feedback flood caused); the 2 s target is reported, met or
# missed. Longer goals (32 000 tokens) were tried: a drill that failed before its cancel left
# 50 of them generating for minutes, and the starved machine failed the other distros' tests
# running beside it.
CANCEL_BURST, CANCEL_TOKENS = 50, 7000
NOT_DELIVERED_BOUND = 2  # of the 50: one was seen under two busy loops (4 % is the bound)
GOALS_TO_SEE_UNDER_WAY = 5  # long goals sent until one is seen started on the engine core
CANCEL_TARGET_S, CANCEL_NODE_IDLE_S, CANCEL_IDLE_S = 2.0, 10.0, 30.0
LATE_RESULT_GOALS, LATE_RESULT_TOKENS = 5, 2000
# A lost result sample used to wait 3 s for the writer's next heartbeat; with the node's DDS
# profile it is resent within ~0.1 s. The target sits between the two; the hard bound is far
# above both (a result that never came would end the goal's 120 s wait instead).
LATE_RESULT_TARGET_S, LATE_RESULT_BOUND_S = 1.5, 15.0
# Goals refused by a dead engine or a server that is down: a median of 9-61 ms measured.
FAIL_FAST_TARGET_S, FAIL_FAST_BOUND_S = 2.0, 15.0


class IO:
    """Test-side ROS node: camera publisher, ~/results and /diagnostics recorders, client."""

    def __init__(self, name: str, node_name: str = "cosmos_reason") -> None:
        self.action = f"/{node_name}/reason"
        self.side = SpunNode(name)
        self.node = self.side.node
        self.cond = threading.Condition()
        self.results: list[ReasoningResult] = []
        self.diagnostics: list[tuple[float, DiagnosticStatus]] = []
        # (the node's stamp in seconds, vLLM's unfinished-request count): when the engine was
        # idle, however late a loaded test process takes the message
        self.engine_counts: list[tuple[float, str]] = []
        self.camera = self.node.create_publisher(Image, "/image", 10)
        self.node.create_subscription(ReasoningResult, f"/{node_name}/results",
                                      self._on_result, 300)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        # The action's feedback as a second subscriber sees it (goal id: messages, last
        # stage, last token count): tells a goal whose feedback the node never published
        # from one whose feedback the client did not hand on.
        self.feedback_seen: dict[str, tuple[int, int, int]] = {}
        self.node.create_subscription(Reason.Impl.FeedbackMessage,
                                      f"{self.action}/_action/feedback",
                                      self._on_feedback, 256)
        self.client = ReasonClient(self.action)  # own participant
        self._camera_stop: threading.Event | None = None

    def _on_result(self, msg: ReasoningResult) -> None:
        with self.cond:
            self.results.append(msg)
            self.cond.notify_all()

    def _on_feedback(self, msg: Reason.Impl.FeedbackMessage) -> None:
        goal_id = bytes(msg.goal_id.uuid).hex()
        with self.cond:
            count = self.feedback_seen.get(goal_id, (0, 0, 0))[0]
            self.feedback_seen[goal_id] = (count + 1, msg.feedback.stage,
                                           msg.feedback.output_tokens)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        with self.cond:
            self.diagnostics.extend((time.monotonic(), s) for s in msg.status)
            stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            self.engine_counts.extend((stamp, values(s)["engine_running_requests"])
                                      for s in msg.status
                                      if "engine_running_requests" in values(s))
            self.cond.notify_all()

    def engine_counted(self, at_least: int, since: float) -> bool:
        """Whether the node's diagnostics stamped after ``since`` (wall clock) counted at least
        ``at_least`` requests in the engine: its own word that goals are under way."""
        with self.cond:
            return any(int(n) >= at_least for t, n in self.engine_counts if t > since)

    def wait_camera_matched(self) -> None:
        assert self.side.wait_matched(self.camera), "the node's camera subscription was not found"

    def camera_on(self, hz: float = 10.0) -> None:
        """Publish fresh frames at ``hz`` from a background thread until ``camera_off``."""
        self.camera_off()
        stop = self._camera_stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                stamp = self.side.now_ns()
                self.camera.publish(rgb_image_msg(scene(320, 240), stamp))
                stop.wait(1.0 / hz)

        threading.Thread(target=loop, daemon=True).start()

    def camera_off(self) -> float:
        if self._camera_stop is not None:
            self._camera_stop.set()
            self._camera_stop = None
        return time.monotonic()

    def wait_diag(self, predicate, timeout_s: float, since: float = 0.0):
        """The first diagnostics status after ``since`` that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for t, status in self.diagnostics:
                    if t >= since and predicate(status):
                        return t, status
                if not self.cond.wait(max(0.0, min(0.5, deadline - time.monotonic()))) \
                        and time.monotonic() >= deadline:
                    return None

    def close(self) -> None:
        self.camera_off()
        self.client.close()
        self.side.close()


def values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def image_goal(prompt: str = "Describe it.", **fields) -> Goal:
    fields.setdefault("max_tokens", 4)
    return ReasonClient.goal(prompt, source=Goal.SOURCE_GOAL_IMAGE,
                             image=rgb_image_msg(scene(64, 48), 1), **fields)


def _ended(handle) -> str | None:
    """How a goal ended as its client saw it (None: not yet)."""
    if not handle.future.done():
        return None
    error = handle.future.exception()
    return repr(error) if error else handle.result(0).status


class Watch:
    """A goal's feedback callback: ``started`` is set once the goal generates tokens."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.messages = 0
        self.last: tuple[int, int, float] | None = None  # stage, tokens, the node's elapsed_s

    def __call__(self, fb: Feedback) -> None:
        self.messages += 1
        self.last = (fb.stage, fb.output_tokens, round(fb.elapsed_s, 2))
        if fb.stage == Feedback.STAGE_GENERATING and fb.output_tokens > 0:
            self.started.set()

    def account(self, handle, io: IO, node: NodeProcess) -> dict:
        """Where the goal stands, as the client, a second subscriber and the node see it."""
        delivery = handle.delivery()
        goal_id = delivery.goal_id if delivery else None
        with io.cond:
            published = [f"{ErrorCode(m.error_code).name}: {m.error_message}"
                         for m in io.results if goal_id and m.goal_id == goal_id]
            seen = io.feedback_seen.get(goal_id)
        return {"sent": handle.sent, "goal_id": goal_id,
                "client's view": delivery and delivery.summary(),
                "client feedback (messages, last)": (self.messages, self.last),
                "second subscriber's feedback (messages, stage, tokens)": seen,
                "result": _ended(handle),
                "on ~/results": published,
                "client spinning": io.client._thread.is_alive(),
                # Whether each participant of this process still sees the node's writers: a
                # client deaf to the node while the second subscriber hears it (a rehearsal)
                # tells discovery lost from replies lost.
                "status, feedback publishers seen by the client, the second subscriber": [
                    (side.count_publishers(f"{io.action}/_action/status"),
                     side.count_publishers(f"{io.action}/_action/feedback"))
                    for side in (io.client.node, io.node)],
                # the goal's own lines, or the node's last ones while its id is not known
                "node log": [ln for ln in node.output.splitlines()
                             if goal_id is None or goal_id[:8] in ln][-3 if goal_id else -12:],
                "node exit code (None: running)": node.proc.poll(),
                "node's last lines": node.output.splitlines()[-5:]}


# The dead-engine drill's kill must land while its goal generates, far from its end. Progress is
# read from the engine core's own CPU time: the core blocks while it has nothing to do, so its
# CPU grows only with the goal's prefill and tokens, at a cost per token that load does not
# change (one thread: OMP_NUM_THREADS=1), and no message has to reach the drill first. The
# client's feedback and the node's diagnostics served before: on loaded runs neither came for
# 20 s of a goal's life, and the drill gave up after five goals.
CORE_STARTED_CPU_S = 1.0  # computed since the goal was sent: past its prefill, generating
CORE_GOAL_CPU_S = 29.0  # a whole 7 000-token goal on the core: 29.4 and 32.4 CPU-s measured
# What the node has sent still comes, however long a loaded run's DDS or a freeze of the
# machine holds it (test/waiting.py).
DELIVERY_NEVER_S = NEVER_S


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _wait_core_busy(core: psutil.Process, since_cpu_s: float, running) -> float | None:
    """The core's CPU seconds since ``since_cpu_s`` once they reach CORE_STARTED_CPU_S while
    the goal is in flight; None when the goal ended first or it never happened (240 s)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not running.future.done():
        used = _cpu_s(core) - since_cpu_s
        if used >= CORE_STARTED_CPU_S:
            return used
        time.sleep(0.02)  # paces: polls the core's CPU counter
    return None


# --- a remote vllm server: down at start, up later, killed mid-stream -----------------------
# First in the file: the in-process node below (a module fixture) must not be up yet, or two
# action servers would answer on /cosmos_reason/reason.

SECRET = f"sk-drill-{uuid.uuid4().hex}"
KEY_ENV = "COSMOS_DRILL_API_KEY"


def timed(io: IO, goal: Goal) -> tuple[float, object]:
    t0 = time.monotonic()
    result = io.client.run(goal, 120)
    return time.monotonic() - t0, result


def test_remote_server_down_then_up_then_killed_mid_stream(tiny_qwen3_vl, record):
    port = free_port()
    node = NodeProcess("remote_server", {
        "engine.url": f"http://127.0.0.1:{port}/v1", "engine.api_key_env": KEY_ENV,
        "engine.start_timeout_s": 2.0, "engine.connect_timeout_s": 1.0,
        "engine.read_timeout_s": 10.0, "diagnostics.period_s": 0.5, **ENDLESS_LIMITS},
        env={KEY_ENV: SECRET})
    server: VllmServer | None = None
    io: IO | None = None
    try:
        node.wait_ready(120)
        assert node.wait_for_line("serving goals with ENGINE_UNAVAILABLE until it is",
                                  NEVER_S)
        io = IO("remote_drill_io")
        assert io.client.wait_for_server(DISCOVERY_S)
        down = [timed(io, image_goal()) for _ in range(5)]
        for _, r in down:
            assert r.error_code is ErrorCode.ENGINE_UNAVAILABLE, r.error_message
        print(f"\nserver down: {down[0][1].error_message}")
        record("server down: ENGINE_UNAVAILABLE (median of 5)",
               statistics.median(t for t, _ in down), "s", FAIL_FAST_TARGET_S,
               FAIL_FAST_BOUND_S)

        server = VllmServer(tiny_qwen3_vl, port, api_key=SECRET)
        t0 = time.monotonic()
        server.wait_healthy()
        t_up = time.monotonic()
        print(f"server healthy after {t_up - t0:.1f} s")
        while True:  # the node notices by itself: no restart, no reconfiguration
            took, r = timed(io, image_goal())
            if r.ok:
                break
            assert r.error_code is ErrorCode.ENGINE_UNAVAILABLE, r.error_message
            assert time.monotonic() - t_up < NEVER_S, "the node never used the server"
            time.sleep(0.2)
        # the node was not restarted: it found the server by itself
        took = time.monotonic() - t_up
        record("first goal succeeded after the server was healthy", took, "s", 10.0, 60.0,
               since=time.time() - took)
        grounded = io.client.run(image_goal("", task="ground", targets=["cup"],
                                            max_tokens=64), 120)
        assert grounded.ok, grounded.error_message

        watch = Watch()
        long = io.client.submit(image_goal("Long.", response_schema=ENDLESS_SCHEMA,
                                           max_tokens=ENDLESS_TOKENS), watch)
        assert watch.started.wait(60), watch.account(long, io, node)
        time.sleep(0.3)
        t_kill = time.monotonic()
        server.kill()
        mid = long.result(60)
        took = time.monotonic() - t_kill
        print(f"server SIGKILL mid-stream: {mid.error_code.name}: {mid.error_message}")
        assert mid.status == "aborted" and mid.error_code is ErrorCode.ENGINE_UNAVAILABLE
        # engine.read_timeout_s is 10 s: the hard bound is above it (the stream's end was
        # noticed, or at worst the read timed out), the target well below it.
        record("server SIGKILL mid-stream: running goal aborted", took, "s", 5.0, 30.0,
               since=time.time() - took)
        after = [timed(io, image_goal()) for _ in range(3)]
        assert all(r.error_code is ErrorCode.ENGINE_UNAVAILABLE for _, r in after)
        assert node.proc.poll() is None

        # Secrets: the key was in use (the server requires it) and never left the process.
        time.sleep(1.0)
        with io.cond:
            published = [str(m) for m in io.results] + [str(s) for _, s in io.diagnostics]
        assert len(published) > 10
        assert not [p for p in published if SECRET in p]
        assert SECRET not in node.output
    finally:
        if io is not None:
            io.close()
        code = node.stop()
        if server is not None:
            server.stop()
    assert code == 0, node.output[-3000:]
    assert SECRET not in node.output


# --- the in-process engine node ---------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tiny_qwen3_vl):
    # The engine core in its own process (vLLM's default), so a drill can kill it.
    proc = NodeProcess("cpu_demo", {
        "engine.model": str(tiny_qwen3_vl), "limits.max_concurrent_goals": MAX_RUNNING,
        **ENDLESS_LIMITS, "limits.max_tokens": CANCEL_TOKENS, "limits.fixed_output_length": True,
        "engine.max_model_len": 8192,
        # 50 x 8 192 tokens of KV cache (the tiny model: 1 KB a token): with the preset's 256 MB
        # a goal admitted late on a starved machine waited behind the others' growing answers
        # and had not started when the drill cancelled.
        "engine.max_num_seqs": 64, "engine.kv_cache_memory_bytes": 512 * 2**20,
        "limits.max_queued_goals": MAX_QUEUED,
        "image.qos_reliability": "reliable", "image.qos_depth": 10, "image.max_age_s": 1.0,
        "diagnostics.period_s": 0.25, "diagnostics.camera_warn_s": 1.0,
        "diagnostics.camera_error_s": 3.0},
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    proc.wait_ready()
    yield proc
    proc.stop_cleanly()


@pytest.fixture(scope="module")
def io(node):
    io = IO("fault_drills_io")
    assert io.client.wait_for_server(DISCOVERY_S)
    io.wait_camera_matched()
    yield io
    io.close()


@pytest.fixture(autouse=True)
def own_client(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each drill on the module's node asks through a client (a DDS participant) of its own.

    A CI run's machine freeze left one client's participant receiving nothing more from the
    node (no feedback, status, goal or result replies for minutes, while a second subscriber
    and the diagnostics kept arriving): with one client for the module, the drill it happened
    in failed and so did every drill after it, each a "not delivered" of the same cause.
    """
    if "io" not in request.fixturenames:
        yield
        return
    io = request.getfixturevalue("io")
    io.client.close()
    io.client = ReasonClient(io.action)
    assert io.client.wait_for_server(DISCOVERY_S)
    yield


def test_100_goals_at_once_every_goal_gets_a_result(io, record):
    io.camera_on()
    time.sleep(0.5)
    with io.cond:
        seen = len(io.results)
    t0 = time.monotonic()
    handles = [io.client.submit(ReasonClient.goal(f"Question {i}?", max_tokens=8,
                                                  max_image_age_s=300.0)) for i in range(100)]
    results = [h.result(300) for h in handles]
    took = time.monotonic() - t0
    codes = [r.error_code for r in results]
    ok, overloaded = codes.count(ErrorCode.OK), codes.count(ErrorCode.OVERLOADED)
    print(f"\n100 goals at once: {ok} succeeded, {overloaded} OVERLOADED")
    record("100 goals at once: all ended", took, "s", 30.0, 300.0, since=time.time() - took)
    assert ok + overloaded == 100, codes
    assert ok >= MAX_RUNNING + MAX_QUEUED
    assert all(r.status == ("succeeded" if r.ok else "rejected") for r in results)
    # Nothing lost silently: each of the 100 also went out on ~/results (refusals too). A goal
    # request asked again because its response was lost may have been refused (and that
    # refusal published) before a later ask was accepted, so ~/results can hold more refusals
    # than the client saw (under load 18 for 9).
    answered = {r.message.goal_id for r in results if r.ok}

    def published() -> tuple[set[str], int]:  # answered goal ids, refusals
        goals = [m for m in io.results[seen:] if m.origin == "goal"]
        return ({m.goal_id for m in goals if m.error_code == 0},
                sum(m.error_code == ErrorCode.OVERLOADED for m in goals))

    with io.cond:
        io.cond.wait_for(lambda: published()[0] >= answered and published()[1] >= overloaded,
                         NEVER_S)
        ids, refusals = published()
    assert ids == answered
    assert refusals >= overloaded


# What only the real engine shows: vLLM's own running count returns to 0 after a burst of
# cancels (it ran on every distro's leg; as a drill it runs once, alone, after the legs). The
# node's side (every goal CANCELED, every request aborted, 50 at once) is in the fast tier
# (test_node_fast.py). At 10 feedback messages a second per goal
# (no total cap) this drill's node stalled for up to a minute under CPU load, every goal
# ending TIMEOUT: limits.feedback_total_rate_hz (docs/RELIABILITY.md, "Mass cancel").
def test_goals_cancelled_at_once_leave_the_engine_idle(node, io, record):
    watches = [Watch() for _ in range(CANCEL_BURST)]
    wall_submit = time.time()
    # Each goal's time limit outlasts the wait for all 50 to start (180 s), so a goal that
    # started first cannot end TIMEOUT while the last ones start on a starved machine.
    handles = [io.client.submit(image_goal("Write a lot.", max_tokens=CANCEL_TOKENS,
                                           timeout_s=240.0), w) for w in watches]
    try:
        _cancel_all_at_once(io, node, watches, handles, wall_submit, record)
    finally:  # whatever failed, no goal goes on loading the machine for the tests after it
        for h in handles:
            if not h.future.done():
                h.cancel()


def _cancel_all_at_once(io: IO, node: NodeProcess, watches: list[Watch], handles: list,
                        wall_submit: float, record) -> None:
    # Under way: every goal seen generating by the client, or all 50 requests inside vLLM by
    # the node's own count (a goal's feedback can stall for a minute under load). A goal that
    # has already ended has nothing left to cancel: in one CI run the client's first two goal
    # responses and their feedback came only as those goals ended their 7 000 tokens, 26 s in.
    def settled(i: int) -> bool:
        return watches[i].started.is_set() or handles[i].future.done()

    def all_in_engine() -> bool:
        ended = sum(h.future.done() for h in handles)
        return io.engine_counted(CANCEL_BURST - ended, since=wall_submit)

    deadline = time.monotonic() + 180
    while not all(settled(i) for i in range(CANCEL_BURST)) and not all_in_engine() \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    waiting = [i for i in range(CANCEL_BURST) if not settled(i)]
    if waiting and not all_in_engine():
        with io.cond:
            last = values(io.diagnostics[-1][1]) if io.diagnostics else {}
        late = {i: watches[i].account(handles[i], io, node) for i in waiting}
        pytest.fail(f"{len(waiting)} of {CANCEL_BURST} goals had not started generating after "
                    f"180 s: {late}; node: "
                    f"{ {k: v for k, v in last.items() if k.startswith(('goals', 'engine'))} }")
    time.sleep(0.5)
    t_cancel, wall_cancel = time.monotonic(), time.time()
    for h in handles:
        h.cancel()
    results = [h.result(DELIVERY_NEVER_S) for h in handles]
    took = time.monotonic() - t_cancel
    # A goal the node ended before its cancel request reached it (by the node's own log) ended
    # rightly 'succeeded': the node's feedback can stall for a minute on a loaded machine
    # (RELIABILITY.md, "Late results: DDS repair"), so the first goal can run its whole
    # answer before the client has seen the last one start. Every other goal must end
    # CANCELLED, and nearly all of them must be in the burst.
    # A goal whose acceptance never reached the client (goal response and status lost under
    # load) ends "not delivered" there, the client's own report, never a silent wait: it is
    # counted against its bound (the fresh-client drill's), not taken for a lost cancel.
    ended_first = [r for r in results if r.status not in ("canceled", "not_delivered")
                   and _ended_before_cancel(node, r)]
    cancelled = [r for r in results if r.status == "canceled"]
    not_delivered = [r for r in results if r.status == "not_delivered"]
    print(f"\n{len(cancelled)} of {CANCEL_BURST} generating goals ended canceled {took:.2f} s "
          f"after the cancel; {len(ended_first)} had ended before their cancel reached the "
          f"node; {len(not_delivered)} not delivered: "
          f"{[r.error_message for r in not_delivered]}")
    record("mass cancel: goals not delivered", len(not_delivered), "goals", 0,
           NOT_DELIVERED_BOUND)
    assert all(r.error_code is ErrorCode.CANCELLED for r in cancelled)
    assert len(cancelled) + len(ended_first) + len(not_delivered) == CANCEL_BURST, [
        (r.status, r.message.finish_reason, r.message.output_tokens, r.message.answer[:60])
        for r in results if r.status != "canceled"]
    assert len(cancelled) >= CANCEL_BURST * 9 // 10
    # vLLM's own unfinished-request count, through diagnostics, drops to zero: when, by the
    # node's stamp (the wall clock of this machine), not when this process took the message.
    def idle_at() -> float | None:
        return next((t for t, n in io.engine_counts if t > wall_cancel and n == "0"), None)

    with io.cond:
        assert io.cond.wait_for(lambda: idle_at() is not None, DELIVERY_NEVER_S), \
            f"the engine still runs requests {DELIVERY_NEVER_S} s after the mass cancel"
        idle = idle_at()
    arrivals = node.logged_at("cancel requested", since=wall_cancel, count=len(cancelled),
                              timeout_s=NEVER_S)
    assert len(arrivals) >= len(cancelled), f"{len(arrivals)} cancel requests logged"
    first, last = min(arrivals), max(arrivals)
    print(f"cancel requests reached the node {first - wall_cancel:+.2f} to "
          f"{last - wall_cancel:+.2f} s after the client sent them (the node's stamps)")
    record("mass cancel: last request delivered", last - wall_cancel, "s", CANCEL_TARGET_S,
           CANCEL_IDLE_S, since=wall_cancel)
    record("mass cancel: engine idle after the last request", idle - last, "s",
           CANCEL_TARGET_S, CANCEL_NODE_IDLE_S, since=last)
    record("mass cancel: engine idle after the cancel", idle - wall_cancel, "s",
           CANCEL_TARGET_S, CANCEL_IDLE_S, since=wall_cancel)
    assert io.client.run(image_goal(), 60).ok


def _ended_before_cancel(node: NodeProcess, r) -> bool:
    """Whether the node logged ``r``'s success before (or without) its cancel request."""
    if r.status != "succeeded":
        return False
    goal = f"goal {r.message.goal_id[:8]} "
    ended = node.logged_at(goal + "succeeded", since=0.0, count=1, timeout_s=5.0)
    cancel = node.logged_at(goal + "cancel requested", since=0.0, count=1, timeout_s=1.0)
    return bool(ended) and (not cancel or ended[0] < cancel[0])


# Before the node's Fast DDS writer profile (dds.py), 5 of 24 results reached the client
# 3.02 s after the node had ended the goal, idle machine or not: a lost sample waited for the
# writer's next heartbeat (3 s). With it: 0.00-0.43 s in 38 of 38 (docs/RELIABILITY.md, "Late
# results: DDS repair"). The target sits between the two.
def test_long_answers_reach_the_client_right_after_the_node_ends_them(io, node, record):
    late = []  # (seconds from the node's end to the client, wall-clock time the span began)
    for _ in range(LATE_RESULT_GOALS):
        t0, watch = time.monotonic(), Watch()
        # A time limit of its own bounds the client's wait (limit + delivery timeout < NEVER_S)
        handle = io.client.submit(image_goal("Long.", max_tokens=LATE_RESULT_TOKENS,
                                             timeout_s=200.0), watch)
        r = handle.result(NEVER_S)
        if not r.ok:
            pytest.fail(f"{r.status} {r.error_message}: {watch.account(handle, io, node)}")
        seconds = time.monotonic() - t0 - r.message.total_s
        late.append((seconds, time.time() - seconds))
    print(f"\n{LATE_RESULT_GOALS} results of {LATE_RESULT_TOKENS} tokens reached the client "
          f"{', '.join(f'{s:.2f}' for s, _ in sorted(late))} s after the node ended the goal")
    latest, since = max(late)
    record(f"result of {LATE_RESULT_TOKENS} tokens: latest arrival after the node ended it",
           latest, "s", LATE_RESULT_TARGET_S, LATE_RESULT_BOUND_S, since=since)


def test_camera_going_silent_is_reported_and_goals_stay_specific(io, record):
    io.camera_on()
    assert io.wait_diag(lambda s: values(s).get("frames_received", "0") != "0", NEVER_S)
    time.sleep(1.0)
    assert io.client.ask("Now?", max_tokens=4).ok
    t_silent, wall_silent = io.camera_off(), time.time()
    warn = io.wait_diag(lambda s: s.level == DiagnosticStatus.WARN
                        and "camera silent for" in s.message, NEVER_S, since=t_silent)
    error = io.wait_diag(lambda s: s.level == DiagnosticStatus.ERROR
                         and "camera silent for" in s.message, NEVER_S, since=t_silent)
    assert warn and error, "diagnostics did not report the silent camera"
    print(f"\ncamera silent: {error[1].message}")
    # thresholds diagnostics.camera_warn_s=1 and camera_error_s=3, published every 0.25 s
    record("camera silent: diagnostics WARN", warn[0] - t_silent, "s", 1.5, 10.0,
           since=wall_silent)
    record("camera silent: diagnostics ERROR", error[0] - t_silent, "s", 3.5, 15.0,
           since=wall_silent)
    stale = io.client.ask("Now?", max_tokens=4)
    assert stale.error_code is ErrorCode.IMAGE_TOO_OLD
    assert "max_image_age_s=1" in stale.error_message
    nothing_new = io.client.run(ReasonClient.goal("Next?", source=Goal.SOURCE_NEXT,
                                                  wait_for_image_s=0.3, max_tokens=4))
    assert nothing_new.error_code is ErrorCode.NO_IMAGE
    assert io.client.run(image_goal(), 60).ok  # goals with their own image still work
    t_back = time.monotonic()
    io.camera_on()
    back = io.wait_diag(lambda s: s.level == DiagnosticStatus.OK, NEVER_S, since=t_back)
    assert back, "diagnostics did not return to OK when the camera came back"
    time.sleep(0.5)
    assert io.client.ask("Now?", max_tokens=4).ok
    io.camera_off()


# A node process held longer than Fast DDS's default participant lease (20 s): its clients
# dropped it, and with it the requests they had sent it during the hold and it had not yet
# taken. Without the node's 300 s lease (cosmos_reason_ros/dds.py) none of the cancels sent
# during a 25-30 s hold reached the node (50 of 50, 10 of 10), and every goal generated its
# whole answer; a CI machine held processes for 19-104 s. Held here on purpose (SIGSTOP), with
# goals generating and cancelled during the hold: their cancels must reach the node, every
# goal must end, and a goal sent after the node resumes must be answered. The node's engine
# processes are held with it, as a machine freeze holds them: left running, the engine core
# can finish the goals before a node resumed late on a starved machine takes their cancels (a
# loaded rehearsal: none of 8 cancels taken, every goal succeeded). A machine freeze can still
# hold the node before the hold, so the drill counts cancels that arrived.
HOLD_S, HELD_GOALS = 30.0, 10


def test_a_node_held_past_the_default_lease_still_answers_its_clients(io, node, record):
    watches = [Watch() for _ in range(HELD_GOALS)]
    handles = [io.client.submit(image_goal("Write a lot.", max_tokens=CANCEL_TOKENS,
                                           timeout_s=240.0), w) for w in watches]
    # All generating: a goal still queued in the node would start only after the hold.
    wait_until(lambda: all(w.started.is_set() or h.future.done()
                           for w, h in zip(watches, handles, strict=True)), NEVER_S,
               "the goals generating before the hold")
    held = [h for h in handles if not h.future.done()]
    assert held, "every goal ended before the hold"
    # The node first on resume: it takes the cancels before its engine generates again.
    tree = [node.proc.pid, *(p.pid for p in psutil.Process(node.proc.pid).children(True))]
    for pid in reversed(tree):
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the hold under way
        wall_cancel = time.time()
        for h in held:
            h.cancel()
        time.sleep(HOLD_S - 1.0)  # the hold itself, not a wait for something to happen
    finally:
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    t_resumed = time.monotonic()
    ended = [h.result(NEVER_S) for h in held]
    assert all(r.status in ("canceled", "succeeded") for r in ended), \
        [(r.status, r.message.output_tokens, r.error_message) for r in ended]
    # Logged as each arrives; a goal the node had already ended when its cancel came logs none.
    # One goal each: a cancel the client sent again is logged again.
    arrived = [r for r in ended if node.logged_at(
        f"goal {r.message.goal_id[:8]} cancel requested", since=wall_cancel, count=1,
        timeout_s=1.0)]
    print(f"\nnode held {HOLD_S:.0f} s: {len(arrived)} of {len(held)} cancels sent during the "
          f"hold reached it; the goals ended {sorted(r.status for r in ended)}")
    record(f"node held {HOLD_S:.0f} s: cancels sent during the hold that never reached it",
           len(held) - len(arrived), "goals", 0, len(held) // 2)
    after = io.client.run(image_goal(), NEVER_S)
    assert after.ok, f"a goal after the hold: {after.status} {after.error_message}"
    took = time.monotonic() - t_resumed
    record(f"node held {HOLD_S:.0f} s: a goal after the hold answered", took, "s", 5.0,
           NEVER_S, since=time.time() - took)


def test_dead_engine_core_fails_goals_fast_and_the_node_stays_up(io, node, record):
    cores = [p for p in psutil.Process(node.proc.pid).children(recursive=True)
             if "EngineCore" in " ".join(p.cmdline())]
    assert len(cores) == 1, [p.cmdline() for p in psutil.Process(node.proc.pid).children()]
    core = cores[0]
    for _ in range(GOALS_TO_SEE_UNDER_WAY):
        before, watch = _cpu_s(core), Watch()
        running = io.client.submit(image_goal("Long.", max_tokens=CANCEL_TOKENS,
                                              timeout_s=600.0), watch)
        used = _wait_core_busy(core, before, running)
        # Killed at the first look past the start; a drill process starved for most of the
        # goal would look late, and that goal is replaced rather than killed near its end.
        if used is not None and used < CORE_GOAL_CPU_S / 2:
            break
        if not running.future.done():
            running.cancel()
            running.result(DELIVERY_NEVER_S)
    else:
        pytest.fail(f"{GOALS_TO_SEE_UNDER_WAY} goals in a row did not start on the engine "
                    f"core, or were seen too late: {watch.account(running, io, node)}")
    wall_kill, t_kill = time.time(), time.monotonic()
    core.kill()
    mid = running.result(DELIVERY_NEVER_S)
    client_s = time.monotonic() - t_kill
    print(f"\nengine core SIGKILL {used:.2f} CPU-s into the goal: {mid.status} "
          f"{mid.error_code.name}: {mid.error_message} ({mid.message.output_tokens} tokens)")
    if mid.status != "aborted":  # the whole account (an assert's message is cut short)
        pytest.fail(f"the goal ended {mid.status} {mid.error_code.name} "
                    f"{mid.message.output_tokens} tokens after the engine core's SIGKILL: "
                    f"{watch.account(running, io, node)}")
    assert mid.error_code in (ErrorCode.ENGINE_UNAVAILABLE, ErrorCode.ENGINE_ERROR)
    ended = node.logged_at(f"goal {mid.message.goal_id[:8]} ended", wall_kill, 1, NEVER_S)
    assert ended, f"the node did not log the goal's end: {node.output[-2000:]}"
    record("engine core SIGKILL mid-stream: running goal aborted (at the node)",
           ended[0] - wall_kill, "s", 1.0, 30.0, since=wall_kill)
    record("engine core SIGKILL mid-stream: running goal's result at the client", client_s,
           "s", 1.0, DELIVERY_NEVER_S, since=wall_kill)
    latencies = []
    for _ in range(5):
        t0 = time.monotonic()
        after = io.client.run(image_goal(), DELIVERY_NEVER_S)
        latencies.append(time.monotonic() - t0)
        assert after.error_code is ErrorCode.ENGINE_UNAVAILABLE, after.error_message
    print(f"after the engine died: {after.error_message}")
    record("dead engine core: ENGINE_UNAVAILABLE (median of 5)", statistics.median(latencies),
           "s", FAIL_FAST_TARGET_S, FAIL_FAST_BOUND_S)
    bad = io.wait_diag(lambda s: s.level == DiagnosticStatus.ERROR
                       and values(s).get("engine_state") != "ready", DELIVERY_NEVER_S,
                       since=t_kill)
    assert bad, "diagnostics did not report the dead engine"
    assert node.proc.poll() is None  # the node itself is still up

