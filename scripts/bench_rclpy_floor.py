"""The floor under the node's action transport: a minimal rclpy action and service, no node.

    source env-kilted.sh && python scripts/bench_rclpy_floor.py [--goals 150] [--rounds 3]

The performance targets ask for the action transport (client end-to-end minus the node's
own time) at <= 2 ms p50 on CPU. This measures what rclpy itself costs on the machine, with
none of the package's code: a server process whose action's execute callback returns at once (one
feedback, then the result), and a client process with rclpy's ``ActionClient`` on a
single-threaded executor, one goal at a time. ``CLOCK_MONOTONIC`` is system-wide, so the
server's and the client's timestamps give each hop. Server variants, interleaved round by
round: a ``MultiThreadedExecutor`` (the node's), a ``SingleThreadedExecutor``, and one with
``--extra`` more waitable entities (services, subscriptions, timers: a wait set the size of
a full node's). A plain service round trip (``GetParameters``) is the DDS + rclpy floor of one
request. rclpy's ``EventsExecutor`` (Kilted) is tried for the service: ``--events``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOPS = (("send", "goal_cb", "goal request reaches the goal callback"),
        ("goal_cb", "accepted", "acceptance reaches the client"),
        ("accepted", "execute", "execute callback starts (after the client's result request)"),
        ("done", "result", "result reaches the client after execute returned"),
        ("send", "result", "whole goal"))


def serve(kind: str, extra: int, log_path: str) -> None:
    """Serve the action (and the node's parameter services), spun by a ``kind`` executor."""
    import rclpy
    from rcl_interfaces.srv import GetParameters
    from rclpy.action import ActionServer, CancelResponse, GoalResponse
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
    from std_msgs.msg import String

    from cosmos_reason_interfaces.action import Reason

    rclpy.init()
    node = rclpy.create_node("floor_server")
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
    marks: dict[str, float] = {}

    def goal_callback(_goal: object) -> GoalResponse:
        marks["goal_cb"] = time.monotonic()
        return GoalResponse.ACCEPT

    def execute(handle: object) -> object:
        marks["execute"] = time.monotonic()
        handle.publish_feedback(Reason.Feedback(stage="generating"))
        handle.succeed()
        marks["done"] = time.monotonic()
        log.write(json.dumps(marks) + "\n")
        log.flush()
        return Reason.Result()

    ActionServer(node, Reason, "floor_reason", execute_callback=execute,
                 goal_callback=goal_callback, cancel_callback=lambda _g: CancelResponse.ACCEPT,
                 callback_group=ReentrantCallbackGroup())
    for i in range(extra):
        node.create_service(GetParameters, f"extra_service_{i}", lambda _req, res: res)
        node.create_subscription(String, f"extra_topic_{i}", lambda _m: None, 10)
    for _ in range(extra // 5):
        node.create_timer(1.0, lambda: None)
    if kind == "events":
        from rclpy.experimental import EventsExecutor
        executor = EventsExecutor()
    else:
        executor = MultiThreadedExecutor(num_threads=8) if kind == "multi" \
            else SingleThreadedExecutor()
    executor.add_node(node)
    print("ready", flush=True)
    executor.spin()


def measure(goals: int, log_path: str, service_only: bool) -> dict[str, float]:
    """Send ``goals`` goals one at a time; return the median of each hop in ms."""
    import rclpy
    from rcl_interfaces.srv import GetParameters
    from rclpy.action import ActionClient
    from rclpy.executors import SingleThreadedExecutor

    from cosmos_reason_interfaces.action import Reason

    rclpy.init()
    node = rclpy.create_node("floor_client")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    service = node.create_client(GetParameters, "/floor_server/get_parameters")
    assert service.wait_for_service(20), "no server"
    trips = []
    for _ in range(goals):
        t0 = time.monotonic()
        future = service.call_async(GetParameters.Request(names=["use_sim_time"]))
        if not _wait(future, 5.0):
            return {"service_ms": float("nan")}
        trips.append((time.monotonic() - t0) * 1e3)
    out = {"service_ms": statistics.median(trips[5:])}
    if service_only:
        return out
    client = ActionClient(node, Reason, "floor_reason")
    assert client.wait_for_server(20)
    rows = []
    for _ in range(goals):
        m: dict[str, float] = {"send": time.monotonic()}
        sent = client.send_goal_async(Reason.Goal(prompt="x"))
        sent.add_done_callback(lambda _f, m=m: m.setdefault("accepted", time.monotonic()))
        assert _wait(sent, 10.0), "no goal response"
        result = sent.result().get_result_async()
        result.add_done_callback(lambda _f, m=m: m.setdefault("result", time.monotonic()))
        assert _wait(result, 10.0), "no result"
        rows.append(m)
    time.sleep(0.3)
    served = [json.loads(line) for line in Path(log_path).read_text().splitlines()]
    pairs = [s | c for c, s in zip(rows, served, strict=True)][5:]  # 5 warm-up goals
    for a, b, _ in HOPS:
        out[f"{a}->{b}"] = statistics.median((m[b] - m[a]) * 1e3 for m in pairs)
    return out


def _wait(future: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0001)
    return True


def run_pair(kind: str, extra: int, goals: int, domain: int) -> dict[str, float]:
    """Start a server process, measure from a client process, stop both."""
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
        server = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(extra),
                                   log.name], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            client = subprocess.run(
                [sys.executable, __file__, "--measure", str(goals), log.name,
                 "1" if kind == "events" else "0"],
                env=env, capture_output=True, text=True, timeout=120)
            lines = client.stdout.strip().splitlines()
            return json.loads(lines[-1]) if lines else {"error": client.stderr[-500:]}
        except subprocess.TimeoutExpired:
            return {"service_ms": float("nan"), "error": "no answer within 120 s"}
        finally:
            server.kill()
            server.wait()


def main() -> int:
    """Interleave the variants round by round; print the medians over rounds."""
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1")),
              flush=True)
        os._exit(0)  # rclpy's spin thread must not be torn down mid-wait (rclpy#1484)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--goals", type=int, default=150, help="goals per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--extra", type=int, default=20,
                   help="extra services + subscriptions (and extra/5 timers) in one variant")
    p.add_argument("--events", action="store_true", help="also try rclpy's EventsExecutor")
    p.add_argument("--domain", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0")))
    args = p.parse_args()
    variants = [("multi", 0), ("single", 0), ("multi", args.extra)]
    if args.events:
        variants.append(("events", 0))
    results: dict[tuple[str, int], list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for kind, extra in variants:
            results[(kind, extra)].append(run_pair(kind, extra, args.goals, args.domain))
    keys = ["service_ms"] + [f"{a}->{b}" for a, b, _ in HOPS]
    print("median over rounds of per-round medians, ms")
    print(f"{'server executor':28}" + "".join(f"{k:>18}" for k in keys))
    for (kind, extra), rows in results.items():
        cells = []
        for k in keys:
            values = [r[k] for r in rows if k in r]
            cells.append(f"{statistics.median(values):18.2f}" if values else f"{'-':>18}")
        label = f"{kind}" + (f" +{extra} entities" if extra else "")
        print(f"{label:28}" + "".join(cells))
    for a, b, what in HOPS:
        print(f"  {a}->{b}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
