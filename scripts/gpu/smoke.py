#!/usr/bin/env python3
"""Smoke check of the GPU machine's environment (run after ``source scripts/gpu/env.sh``).

    python3 scripts/gpu/smoke.py ros pkg node       # after the ROS kit + interfaces build
    python3 scripts/gpu/smoke.py ros pkg node vllm  # after the vLLM site tree too

Prints one ``OK <check> ...`` or ``FAIL <check>: <error>`` line per check and exits 1 when
any check failed. Checks:

- ``ros``: rclpy init + a node; Reason action and ReasoningResult imports; a pub/sub round
  trip of ReasoningResult and sensor_msgs/Image over DDS (rmw_fastrtps_cpp, localhost); a
  Reason action round trip (goal -> feedback -> result) between two nodes.
- ``pkg``: cosmos_reason_ros imports (core, engines, ros.node, client, bench).
- ``node``: ``python -m cosmos_reason_ros.ros.node`` as a process (openai engine pointed at a
  closed port): its ``~/reason`` action answers a goal with ENGINE_UNAVAILABLE; SIGTERM ends it.
- ``vllm``: ``import vllm`` (time, version), torch + CUDA, and the vLLM names
  ``engines.vllm_local`` resolves (a missing optional name is reported, not failed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback

FAILED: list[str] = []
T0 = time.monotonic()
ROUNDTRIP_TIMEOUT_S = 20.0


def check(name):
    """Wrap a check: print OK with its result text and time, or FAIL with the error."""
    def deco(fn):
        def run():
            t = time.monotonic()
            try:
                detail = fn()
                print(f"OK {name} ({time.monotonic() - t:.2f} s){': ' + detail if detail else ''}",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - report every failure and go on
                FAILED.append(name)
                print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
                traceback.print_exc(limit=4)
        return run
    return deco


def wait_for(predicate, timeout_s, executor, what):
    """Spin ``executor`` until ``predicate()`` holds; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        executor.spin_once(timeout_sec=0.05)


@check("ros: rclpy init, node, interface imports")
def ros_imports():
    """Init rclpy, create a node, import the interfaces the node and the bench use."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray  # noqa: F401
    from geometry_msgs.msg import Point  # noqa: F401
    from rosgraph_msgs.msg import Clock  # noqa: F401
    from sensor_msgs.msg import Image  # noqa: F401

    from cosmos_reason_interfaces.action import Reason  # noqa: F401
    from cosmos_reason_interfaces.msg import ReasoningResult  # noqa: F401

    rclpy.init()
    node = rclpy.create_node("gpu_smoke_imports")
    name = node.get_fully_qualified_name()
    node.destroy_node()
    rclpy.shutdown()
    return f"{name}; RMW_IMPLEMENTATION={os.environ.get('RMW_IMPLEMENTATION', '(default)')}"


@check("ros: pub/sub round trip (ReasoningResult + 640x480 Image)")
def ros_pubsub():
    """Publish a ReasoningResult and a 640x480 Image, receive both in another node."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from cosmos_reason_interfaces.msg import Box2D, ReasoningResult

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        pub_node = rclpy.create_node("gpu_smoke_pub", context=ctx)
        sub_node = rclpy.create_node("gpu_smoke_sub", context=ctx)
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(pub_node)
        ex.add_node(sub_node)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        got: dict[str, object] = {}
        sub_node.create_subscription(ReasoningResult, "/gpu_smoke/result",
                                     lambda m: got.setdefault("result", m), qos)
        sub_node.create_subscription(Image, "/gpu_smoke/image",
                                     lambda m: got.setdefault("image", m), qos)
        pub_r = pub_node.create_publisher(ReasoningResult, "/gpu_smoke/result", qos)
        pub_i = pub_node.create_publisher(Image, "/gpu_smoke/image", qos)
        wait_for(lambda: pub_r.get_subscription_count() > 0 and pub_i.get_subscription_count() > 0,
                 ROUNDTRIP_TIMEOUT_S, ex, "subscription match")
        msg = ReasoningResult(goal_id="g1", answer="yes", image_width=640, image_height=480)
        msg.boxes = [Box2D(label="cup", x_min=1.0, y_min=2.0, x_max=3.0, y_max=4.0)]
        img = Image(height=480, width=640, encoding="rgb8", step=640 * 3,
                    data=bytes(range(256)) * (640 * 480 * 3 // 256))
        t = time.monotonic()
        pub_r.publish(msg)
        pub_i.publish(img)
        wait_for(lambda: "result" in got and "image" in got, ROUNDTRIP_TIMEOUT_S, ex, "delivery")
        dt = time.monotonic() - t
        r, i = got["result"], got["image"]
        assert r.goal_id == "g1" and r.answer == "yes" and r.boxes[0].label == "cup", r
        assert r.boxes[0].x_max == 3.0, r.boxes
        assert i.width == 640 and len(i.data) == 640 * 480 * 3 and bytes(i.data[:4]) == b"\0\1\2\3"
        ex.shutdown()
        pub_node.destroy_node()
        sub_node.destroy_node()
        return f"delivered in {dt * 1e3:.1f} ms"
    finally:
        rclpy.shutdown(context=ctx)


@check("ros: Reason action round trip (goal, feedback, result)")
def ros_action():
    """Send a Reason goal to an action server in another node; check feedback and result."""
    import rclpy
    from rclpy.action import ActionClient, ActionServer
    from rclpy.executors import MultiThreadedExecutor

    from cosmos_reason_interfaces.action import Reason

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    try:
        server_node = rclpy.create_node("gpu_smoke_action_server", context=ctx)
        client_node = rclpy.create_node("gpu_smoke_action_client", context=ctx)

        def execute(goal_handle):
            fb = Reason.Feedback(stage="generating", text_delta="ye", output_tokens=1)
            goal_handle.publish_feedback(fb)
            goal_handle.succeed()
            res = Reason.Result()
            res.result.answer = goal_handle.request.prompt.upper()
            res.result.output_tokens = 2
            return res

        ActionServer(server_node, Reason, "/gpu_smoke/reason", execute)
        client = ActionClient(client_node, Reason, "/gpu_smoke/reason")
        ex = MultiThreadedExecutor(num_threads=2, context=ctx)
        ex.add_node(server_node)
        ex.add_node(client_node)
        spin = threading.Thread(target=ex.spin, daemon=True)
        spin.start()
        if not client.wait_for_server(timeout_sec=ROUNDTRIP_TIMEOUT_S):
            raise TimeoutError("action server not discovered")
        feedback: list[str] = []
        t = time.monotonic()
        fut = client.send_goal_async(Reason.Goal(prompt="yes?"),
                                     feedback_callback=lambda f: feedback.append(f.feedback.stage))
        deadline = time.monotonic() + ROUNDTRIP_TIMEOUT_S
        while not fut.done():
            if time.monotonic() > deadline:
                raise TimeoutError("goal not accepted")
            time.sleep(0.01)
        handle = fut.result()
        assert handle.accepted
        rfut = handle.get_result_async()
        while not rfut.done():
            if time.monotonic() > deadline:
                raise TimeoutError("no result")
            time.sleep(0.01)
        dt = time.monotonic() - t
        answer = rfut.result().result.result.answer
        assert answer == "YES?", answer
        ex.shutdown()
        spin.join(timeout=5)
        return f"answer {answer!r}, feedback {feedback}, {dt * 1e3:.1f} ms"
    finally:
        rclpy.shutdown(context=ctx)


@check("pkg: cosmos_reason_ros imports")
def pkg_imports():
    """Import the package's core, engines and (with rclpy) ROS modules."""
    import importlib

    mods = ["cosmos_reason_ros.core.types", "cosmos_reason_ros.core.query",
            "cosmos_reason_ros.core.parsing", "cosmos_reason_ros.core.imaging",
            "cosmos_reason_ros.engines.factory", "cosmos_reason_ros.engines.vllm_local",
            "cosmos_reason_ros.engines.openai_http"]
    ros_mods = ["cosmos_reason_ros.ros.node", "cosmos_reason_ros.client",
                "cosmos_reason_ros.bench.runner", "cosmos_reason_ros.bench.baseline"]
    have_ros = importlib.util.find_spec("rclpy") is not None
    for m in mods + (ros_mods if have_ros else []):
        if importlib.util.find_spec(m) is None:
            raise ImportError(f"{m} not found")
        importlib.import_module(m)
    import cosmos_reason_ros
    return f"{len(mods) + (len(ros_mods) if have_ros else 0)} modules from " \
           f"{os.path.dirname(os.path.dirname(cosmos_reason_ros.__file__))}"


@check("node: cosmos_reason_ros.ros.node process serves ~/reason (openai engine, no server)")
def node_process():
    """Start the node (engine down on purpose), send a goal, expect ENGINE_UNAVAILABLE."""
    import signal
    import subprocess

    import rclpy
    from rclpy.action import ActionClient
    from rclpy.executors import SingleThreadedExecutor

    from cosmos_reason_interfaces.action import Reason
    from cosmos_reason_interfaces.msg import ReasoningResult

    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args",
            "-r", "__node:=gpu_smoke_node", "-p", "engine.kind:=openai",
            "-p", "engine.model:=m", "-p", "model.family:=qwen3_vl",
            "-p", "engine.url:=http://127.0.0.1:9/v1",
            "-p", "engine.start_timeout_s:=3.0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    t = time.monotonic()
    try:
        node = rclpy.create_node("gpu_smoke_node_client", context=ctx)
        client = ActionClient(node, Reason, "/gpu_smoke_node/reason")
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        if not client.wait_for_server(timeout_sec=60.0):
            raise TimeoutError("the node's ~/reason action server did not appear in 60 s")
        up = time.monotonic() - t
        fut = client.send_goal_async(Reason.Goal(prompt="Is the path clear?", wait_for_image_s=0.5))
        ex.spin_until_future_complete(fut, timeout_sec=ROUNDTRIP_TIMEOUT_S)
        handle = fut.result()
        if handle is None or not handle.accepted:
            raise RuntimeError("goal not accepted")
        rfut = handle.get_result_async()
        ex.spin_until_future_complete(rfut, timeout_sec=ROUNDTRIP_TIMEOUT_S)
        if rfut.result() is None:
            raise TimeoutError("no result")
        res = rfut.result().result.result
        if res.error_code != ReasoningResult.ENGINE_UNAVAILABLE:
            raise AssertionError(f"expected ENGINE_UNAVAILABLE, got {res.error_code}: "
                                 f"{res.error_message}")
        return f"action server up after {up:.1f} s; goal -> ENGINE_UNAVAILABLE as expected"
    except Exception:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        print(proc.communicate(timeout=10)[0].decode(errors="replace")[-2000:], flush=True)
        raise
    finally:
        rclpy.shutdown(context=ctx)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@check("vllm: import, version, torch/CUDA, names used by engines.vllm_local")
def vllm_import():
    """Import vLLM and torch, and resolve the vLLM names engines.vllm_local uses."""
    t = time.monotonic()
    import vllm
    dt = time.monotonic() - t
    import torch

    from cosmos_reason_ros.engines.vllm_local import _import_vllm
    names = _import_vllm()
    missing = [k for k, v in vars(names).items() if v is None]
    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else "no CUDA"
    return (f"vllm {vllm.__version__} (import {dt:.1f} s), torch {torch.__version__}, {gpu}; "
            f"optional vLLM names absent (handled by fallbacks): {missing or 'none'}")


def main(argv: list[str]) -> int:
    """Run the named check groups (default: ros pkg); 1 when any check failed."""
    groups = set(argv) or {"ros", "pkg"}
    unknown = groups - {"ros", "pkg", "node", "vllm"}
    if unknown:
        print(f"smoke: unknown check group(s) {sorted(unknown)}; use ros, pkg, node, vllm",
              file=sys.stderr)
        return 2
    import platform

    print(f"smoke: python {platform.python_version()} at {sys.executable}; groups {sorted(groups)}",
          flush=True)
    if "ros" in groups:
        ros_imports()
        ros_pubsub()
        ros_action()
    if "pkg" in groups:
        pkg_imports()
    if "node" in groups:
        node_process()
    if "vllm" in groups:
        vllm_import()
    print(f"smoke: {'FAILED ' + ', '.join(FAILED) if FAILED else 'all OK'} "
          f"({time.monotonic() - T0:.1f} s)", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
