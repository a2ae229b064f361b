"""The fleet phase: N robots share two ``vllm serve`` backends through the real ``vllm-router``.

One router per routing policy runs at once over the same two backends (``POLICIES``):
``consistent_hash`` (reported as ``affinity``: the node's ``X-Session-ID`` header hashed onto a
ring), ``sticky_least_loaded`` (a new session goes to the backend holding the fewest sessions
and stays there), ``cache_aware`` (the backend whose earlier requests share the longest prefix
with this one, unless the load is too uneven) and ``round_robin``. Each policy has its own N
robots: a node process (``config/remote_server.yaml``, ``engine.kind: openai``, ``engine.url``
its policy's router, ``prefill.enabled: true``, the default session key) in its own namespace
with its own camera, every camera streaming its own pictures at ``--fleet-camera-hz`` the whole
time, so every policy's prefills load the backends alike. Each round, policy by policy
(rotating order), all N robots of one policy at once: a goal on the latest frame, at a random
phase of the camera, then a follow-up question on the same frame (the robot's camera holds
still for the pair). Measured per policy: TTFT (the result's ``time_to_first_token_s``),
prefix-cache hit rate (the result's cached / prompt tokens) and requests per backend (each
router's own per-worker counter, so the policies' traffic is told apart).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

from cosmos_reason_ros.bench.processes import (
    ROUTER_BINARY,
    ROUTER_REQUESTS,
    Proc,
    free_port,
    http_get,
    prometheus_sums,
    start_ros_node,
    start_router,
    start_server,
)
from cosmos_reason_ros.bench.results import Results
from cosmos_reason_ros.bench.workload import (
    FLEET_CPU_SERVER_ARGS,
    LENGTHS,
    PROMPT,
    PROMPT_2,
    SERVED_NAME,
    engine_settings,
    picture,
    rotated,
    size_name,
)

if TYPE_CHECKING:
    from cosmos_reason_ros.bench.runner import Bench

SERVER_START_S = 420.0  # bound of a server start (40-110 s each on a loaded 2-core machine)
START_S = 120.0  # bound of a router's or a node's start, and of discovery
GOAL_TIMEOUT_S = 60.0  # the nodes' limits.goal_timeout_s (a stalled server ends a goal)
BACKEND_METRICS = ("vllm:request_success_total", "vllm:prefix_cache_queries_total",
                   "vllm:prefix_cache_hits_total")
# The policies measured, by report name: each one's ``vllm-router --policy`` (all offered by
# vllm-router 0.1.17). ``affinity`` is the name the report's target line compares with
# ``round_robin``. Left out: ``random`` and ``power_of_two`` (no affinity, like round robin)
# and ``kv_aware`` (it scores the backends' KV cache events, which ``vllm serve`` publishes only
# when configured to, over ZMQ).
POLICIES = {"affinity": "consistent_hash", "sticky_least_loaded": "sticky_least_loaded",
            "cache_aware": "cache_aware", "round_robin": "round_robin"}
# How vllm-router 0.1.17 logs where it placed a session (at INFO, whatever --log-level says):
# consistent_hash on every request, sticky_least_loaded on a session's first one. The other
# policies log no placement.
_PLACED = re.compile(r"key='header:x-session-id:(?P<hashed>[^']+)' -> worker='(?P<ring>[^']+)'"
                     r"|new session '(?P<sticky>[^']+)' -> replica '(?P<least>[^']+)'")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class Robot:
    """One simulated robot: its node process, camera, picture and action client."""

    policy: str
    index: int
    proc: Proc
    base: Any  # its camera's picture (numpy rgb); each frame differs in a corner block
    topic: str
    action: str
    client: Any = None
    publisher: Any = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    frozen: bool = False
    frames: int = 0
    last_stamp: int = 0

    @property
    def name(self) -> str:
        """``<policy>/robot<i>``."""
        return f"{self.policy}/robot{self.index}"


class _Cameras:
    """The robots' cameras: one publisher node in a context of its own, one thread at ``hz``."""

    def __init__(self, robots: list[Robot], hz: float) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        self.rclpy = rclpy
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("bench_fleet_cameras", context=self.context)
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        for robot in robots:
            robot.publisher = self.node.create_publisher(Image, robot.topic, qos)
        self.robots = robots
        self.period_s = 1.0 / hz
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def wait_subscribed(self, deadline: float) -> None:
        """Wait until every camera has its node's subscription."""
        while time.monotonic() < deadline:
            if all(r.publisher.get_subscription_count() > 0 for r in self.robots):
                return
            time.sleep(0.1)
        missing = [r.name for r in self.robots if r.publisher.get_subscription_count() == 0]
        raise TimeoutError(f"cameras without a subscriber: {missing}")

    def _run(self) -> None:
        from std_msgs.msg import Header

        from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

        while not self.stop_event.is_set():
            t0 = time.monotonic()
            for robot in self.robots:
                with robot.lock:
                    if robot.frozen:
                        continue
                    # Every frame differs (a corner block coloured by its number), so no frame
                    # is in a server's cache unless a prefill or a goal of its robot put it
                    # there; the robots' pictures differ too.
                    frame = robot.base.copy()
                    i = robot.frames
                    frame[:32, :32] = (i % 251, (i // 251) % 251, 255)
                    stamp = self.node.get_clock().now().nanoseconds
                    with contextlib.suppress(Exception):
                        robot.publisher.publish(rgb_image(frame, Header(
                            stamp=ns_to_stamp(stamp), frame_id=robot.name)))
                        robot.frames += 1
                        robot.last_stamp = stamp
            self.stop_event.wait(max(0.0, self.period_s - (time.monotonic() - t0)))

    def close(self) -> None:
        """Stop the thread and the node."""
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(5)
        with contextlib.suppress(Exception):
            self.node.destroy_node()
        self.rclpy.try_shutdown(context=self.context)


def _namespace(policy: str) -> str:
    """Return the namespace of a policy's robots (their session keys start with it)."""
    return f"/fleet/{policy}"


def _served_model(root: str) -> str:
    """Return the model a running server serves (the first of its ``/v1/models``)."""
    status, text = http_get(root + "/v1/models")
    try:
        return str(json.loads(text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise RuntimeError(f"{root}/v1/models: HTTP {status}, no model in {text[:200]!r}"
                           ) from None


def _router_counts(metrics_port: int, workers: list[str]) -> dict[str, float]:
    """Return the requests the router sent to each worker so far (its per-worker counter)."""
    status, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    if status != 200:
        return {}
    sums = prometheus_sums(text, [ROUTER_REQUESTS], label="worker")
    out = {}
    for i, root in enumerate(workers):
        out[f"backend{i}"] = sum(v for k, v in sums.items() if k.endswith("|" + root)
                                 or k.endswith("|" + root + "/"))
    return out


def sessions_per_backend(log_text: str, workers: list[str], prefix: str) -> dict[str, int]:
    """Count the sessions keyed ``prefix...`` that a router's log places on each worker.

    A session is one camera's ``X-Session-ID`` (all its goals and prefills); a key placed
    twice (its worker went down) counts where it went last. Empty when the log places none
    of them (a policy that does not log placements).
    """
    placed = {}
    for m in _PLACED.finditer(_ANSI.sub("", log_text)):
        key = m.group("hashed") or m.group("sticky")
        if key.startswith(prefix):
            placed[key] = (m.group("ring") or m.group("least")).rstrip("/")
    if not placed:
        return {}
    return {f"backend{i}": sum(url == root.rstrip("/") for url in placed.values())
            for i, root in enumerate(workers)}


def _backend_metrics(workers: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for i, root in enumerate(workers):
        status, text = http_get(root + "/metrics")
        out[f"backend{i}"] = prometheus_sums(text, BACKEND_METRICS) if status == 200 else {}
    return out


def _ask_pair(robot: Robot, results: Results, r: int, size: str, phase_s: float,
              rng: random.Random) -> None:
    """Ask on the latest frame at a random phase of the camera, then again on that frame."""
    from cosmos_reason_ros.bench.ros_side import submit_goal

    time.sleep(rng.uniform(0.0, phase_s))
    with robot.lock:
        robot.frozen = True
        stamp = robot.last_stamp
    try:
        # The last frame reaches the node: acked by its reader, then its callback runs (a
        # fixed 20 ms let ~6 % of follow-ups see a later frame on a loaded machine, 100 ms
        # still let 4-10 first questions of 64 see an earlier one at load 15-28).
        wait_acked = getattr(robot.publisher, "wait_for_all_acked", None)
        if wait_acked is not None:
            from rclpy.duration import Duration

            with contextlib.suppress(Exception):
                wait_acked(Duration(seconds=2.0))
        time.sleep(0.3)
        first_stamp = None
        for q, prompt in ((1, PROMPT), (2, PROMPT_2)):
            try:
                out = submit_goal(robot.client, prompt, LENGTHS["short"])()
            except Exception as e:  # noqa: BLE001 - one failed request is a sample
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            if q == 1:
                first_stamp = out.get("stamp_ns")
            elif out.get("ok") and out.get("stamp_ns") != first_stamp:
                out.update(ok=False, error="the follow-up was answered about another frame")
            prompt_tokens = out.get("prompt_tokens") or 0
            hit = (out.get("cached_prompt_tokens") or 0) / prompt_tokens if prompt_tokens \
                else None
            results.sample(phase="fleet", mode="node", policy=robot.policy,
                           robot=robot.index, question=q, size=size, round=r, warmup=r < 0,
                           hit_rate=hit, on_last_frame=out.get("stamp_ns") == stamp, **out)
    finally:
        with robot.lock:
            robot.frozen = False


def run(bench: Bench, results: Results) -> None:
    """Start the fleet, ask round by round (policies interleaved), record, stop everything."""
    if shutil.which(ROUTER_BINARY) is None:
        results.mode("fleet", status="error",
                     error=f"{ROUTER_BINARY} is not on PATH (pip install vllm-router; make "
                           f"setup installs it)")
        return
    try:
        import rclpy  # noqa: F401
    except ImportError as e:
        results.mode("fleet", status="error", error=f"ROS 2 is not importable here: {e}")
        return
    a = bench.args
    deadline = bench.budget.phase_deadline("fleet")
    log_dir = results.out / "logs"
    log_dir.mkdir(exist_ok=True)
    n = a.fleet_robots
    size = bench.sizes[0]
    settings, extras = engine_settings(a.device, a.engine_args)
    if a.device == "cpu":
        extras = {**FLEET_CPU_SERVER_ARGS, **extras}
    procs: list[Proc] = []
    robots: list[Robot] = []
    cameras: _Cameras | None = None
    try:
        if a.fleet_backends:  # servers already running (a rack, or a test's)
            workers, starts = list(a.fleet_backends), {}
            served = _served_model(workers[0])
        else:
            ports = [free_port(), free_port()]
            workers = [f"http://127.0.0.1:{p}" for p in ports]
            servers = [start_server(a.model, settings, extras, p, log_dir,
                                    name=f"fleet_server{i}") for i, p in enumerate(ports)]
            procs += servers
            starts = {f"backend{i}": s.wait_url(workers[i] + "/health",
                                                min(deadline, time.monotonic() + SERVER_START_S))
                      for i, s in enumerate(servers)}
            served = SERVED_NAME
        routers: dict[str, tuple[Proc, str, int]] = {}
        for policy, flag in POLICIES.items():
            port, metrics_port = free_port(), free_port()
            router = start_router(port, workers, flag, log_dir, name=f"fleet_router_{policy}",
                                  metrics_port=metrics_port)
            procs.append(router)
            routers[policy] = (router, f"http://127.0.0.1:{port}", metrics_port)
        for policy, (router, root, _) in routers.items():
            starts[f"router_{policy}"] = router.wait_url(
                root + "/readiness", min(deadline, time.monotonic() + START_S))
        for policy, (_, root, _) in routers.items():
            for i in range(n):
                ns = f"{_namespace(policy)}/robot{i}"
                proc = start_ros_node(f"fleet_{policy}_robot{i}", "remote_server", {
                    "engine.url": root + "/v1", "engine.model": served,
                    "engine.api_key_env": "",
                    "engine.connect_timeout_s": 2.0, "engine.read_timeout_s": 30.0,
                    "engine.start_timeout_s": START_S, "prefill.enabled": True,
                    "image.qos_reliability": "reliable", "image.qos_depth": 1,
                    "image.max_age_s": 0.0, "limits.max_concurrent_goals": 4,
                    "limits.max_queued_goals": 16, "limits.max_tokens": 1024,
                    "limits.goal_timeout_s": GOAL_TIMEOUT_S, "limits.fixed_output_length": True,
                }, [f"__ns:={ns}", f"image:={ns}/camera"], log_dir)
                procs.append(proc)
                robots.append(Robot(policy, i, proc, picture(size[0], size[1],
                                                             bench.next_seed()),
                                    f"{ns}/camera", f"{ns}/cosmos_reason/reason"))
        from cosmos_reason_ros.client import ReasonClient

        node_deadline = min(deadline, time.monotonic() + START_S)
        starts["nodes"] = max(robot.proc.wait_line("]: ready: ", node_deadline)
                              for robot in robots)
        cameras = _Cameras(robots, a.fleet_camera_hz)
        # Discovery has a bound of its own, from here, and the clients' nodes share the
        # cameras' context, so the bench side is one DDS participant: with a context per
        # client (8 robots x 4 policies: 65 participants in all) a client still had no action
        # server at the end of the start bound, at load 43 on 2 cores.
        discovery_deadline = min(deadline, time.monotonic() + START_S)
        for robot in robots:
            robot.client = ReasonClient(robot.action, context=cameras.context,
                                        node_name=f"bench_fleet_client_{robot.policy}_"
                                        f"{robot.index}")
        for robot in robots:
            if not robot.client.wait_for_server(max(1.0, discovery_deadline
                                                    - time.monotonic())):
                raise TimeoutError(f"{robot.action}: no action server")
        cameras.wait_subscribed(discovery_deadline)
        cameras.thread.start()
        while min(r.frames for r in robots) < 3 and time.monotonic() < discovery_deadline:
            time.sleep(0.05)  # a few frames out before the first goal (NO_IMAGE otherwise)
        results.extra("fleet_start_s", starts)
        _rounds(bench, results, robots, routers, workers, deadline, size_name(size))
    finally:
        for robot in robots:  # before the cameras, whose context the clients' nodes are in
            if robot.client is not None:
                with contextlib.suppress(Exception):
                    robot.client.close()
        if cameras is not None:
            cameras.close()
        for proc in reversed(procs):  # nodes, routers, then the servers
            with contextlib.suppress(Exception):
                proc.stop()


def _rounds(bench: Bench, results: Results, robots: list[Robot],
            routers: dict[str, tuple[Proc, str, int]], workers: list[str], deadline: float,
            size: str) -> None:
    """Round by round, each policy's N robots at once (rotating policy order)."""
    wanted = bench.args.repeats or bench.device.repeats
    rng = random.Random(7)
    phase_s = 1.0 / bench.args.fleet_camera_hz
    policies = list(POLICIES)
    rounds = 0
    before: dict[str, Any] = {}
    for r in range(-1, wanted):
        if r >= 1 and time.monotonic() > deadline:
            break
        if r == 0:  # counters from here on: the measured rounds (prefills included)
            before = _counters(routers, workers)
        for policy in rotated(policies, r):
            threads = [threading.Thread(target=_ask_pair, daemon=True, args=(
                robot, results, r, size, phase_s, random.Random(rng.random())))
                for robot in robots if robot.policy == policy]
            for t in threads:
                t.start()
            for t in threads:  # a goal ends within GOAL_TIMEOUT_S (the node's limit)
                t.join(max(5.0, deadline + GOAL_TIMEOUT_S - time.monotonic()))
        rounds += r >= 0
        if r >= 0:  # after every round, so a run stopped at its time limit keeps them
            _record(bench, results, before, _counters(routers, workers),
                    _sessions(routers, workers))
    results.mode("fleet", status="ran", rounds=rounds, wanted=wanted)


def _counters(routers: dict[str, tuple[Proc, str, int]], workers: list[str]
              ) -> dict[str, Any]:
    return {"routers": {p: _router_counts(m, workers) for p, (_, _, m) in routers.items()},
            "backends": _backend_metrics(workers)}


def _sessions(routers: dict[str, tuple[Proc, str, int]], workers: list[str]
              ) -> dict[str, dict[str, int]]:
    """Per policy, the robots' sessions per backend, where its router logs placements."""
    out = {}
    for policy, (router, _, _) in routers.items():
        with contextlib.suppress(OSError):
            placed = sessions_per_backend(router.log.read_text(errors="replace"), workers,
                                          _namespace(policy) + "/")
            if placed:
                out[policy] = placed
    return out


def _record(bench: Bench, results: Results, before: dict[str, Any],
            after: dict[str, Any], sessions: dict[str, dict[str, int]]) -> None:
    """Store the fleet's settings, counters over the measured rounds, sessions per backend."""
    requests = {p: {b: v - before.get("routers", {}).get(p, {}).get(b, 0.0)
                    for b, v in counts.items()} for p, counts in after["routers"].items()}
    backends = {b: {m: v - before.get("backends", {}).get(b, {}).get(m, 0.0)
                    for m, v in values.items()} for b, values in after["backends"].items()}
    results.extra("fleet", {"robots_per_policy": bench.args.fleet_robots,
                            "camera_hz": bench.args.fleet_camera_hz,
                            "policies": dict(POLICIES),
                            "requests_per_backend": requests, "sessions_per_backend": sessions,
                            "backend_metrics": backends})
