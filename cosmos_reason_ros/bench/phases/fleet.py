"""The fleet phase: N robots share two ``vllm serve`` backends through the real ``vllm-router``.

Two routers run at once over the same two backends, one per policy: ``consistent_hash``
(session affinity on the node's ``X-Session-ID`` header) and ``round_robin``. Each policy has
its own N robots: a node process (``config/remote_server.yaml``, ``engine.kind: openai``,
``engine.url`` its policy's router, ``prefill.enabled: true``) in its own namespace with its
own camera, every camera streaming its own pictures at ``--fleet-camera-hz`` the whole time,
so both policies' prefills load the backends alike. Each round, policy by policy (rotating
order), all N robots of one policy at once: a goal on the latest frame, at a random phase of
the camera, then a follow-up question on the same frame (the robot's camera holds still for
the pair). Measured per policy: TTFT (the result's ``time_to_first_token_s``), prefix-cache
hit rate (the result's cached / prompt tokens) and requests per backend (each router's own
per-worker counter, so the two policies' traffic is told apart).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
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
    FLEET_POLICIES,
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
        for policy, flag in FLEET_POLICIES.items():
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
                ns = f"/fleet/{policy}/robot{i}"
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
        for robot in robots:
            robot.client = ReasonClient(robot.action, node_name=f"bench_fleet_client_"
                                        f"{robot.policy}_{robot.index}")
        for robot in robots:
            if not robot.client.wait_for_server(max(1.0, node_deadline - time.monotonic())):
                raise TimeoutError(f"{robot.action}: no action server")
        cameras.wait_subscribed(node_deadline)
        cameras.thread.start()
        while min(r.frames for r in robots) < 3 and time.monotonic() < node_deadline:
            time.sleep(0.05)  # a few frames out before the first goal (NO_IMAGE otherwise)
        results.extra("fleet_start_s", starts)
        _rounds(bench, results, robots, routers, workers, deadline, size_name(size))
    finally:
        if cameras is not None:
            cameras.close()
        for robot in robots:
            if robot.client is not None:
                with contextlib.suppress(Exception):
                    robot.client.close()
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
    policies = list(FLEET_POLICIES)
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
            _record(bench, results, before, _counters(routers, workers))
    results.mode("fleet", status="ran", rounds=rounds, wanted=wanted)


def _counters(routers: dict[str, tuple[Proc, str, int]], workers: list[str]
              ) -> dict[str, Any]:
    return {"routers": {p: _router_counts(m, workers) for p, (_, _, m) in routers.items()},
            "backends": _backend_metrics(workers)}


def _record(bench: Bench, results: Results, before: dict[str, Any],
            after: dict[str, Any]) -> None:
    """Store the fleet's settings and its counters over the measured rounds so far."""
    requests = {p: {b: v - before.get("routers", {}).get(p, {}).get(b, 0.0)
                    for b, v in counts.items()} for p, counts in after["routers"].items()}
    backends = {b: {m: v - before.get("backends", {}).get(b, {}).get(m, 0.0)
                    for m, v in values.items()} for b, values in after["backends"].items()}
    results.extra("fleet", {"robots_per_policy": bench.args.fleet_robots,
                            "camera_hz": bench.args.fleet_camera_hz,
                            "policies": dict(FLEET_POLICIES),
                            "requests_per_backend": requests, "backend_metrics": backends})
