"""Speculative frame prefill on the real node (tiny model, CPU engine with prefix caching)."""

from __future__ import annotations

import json
import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from node_process import (  # noqa: E402
    ENDLESS_LIMITS,
    ENDLESS_SCHEMA,
    ENDLESS_TOKENS,
    NodeProcess,
    rgb_image_msg,
    scene,
)
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from spun_node import SpunNode  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_ros.client import ReasonClient  # noqa: E402
from cosmos_reason_ros.core import query  # noqa: E402
from cosmos_reason_ros.core.models import detect_profile  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.engine, pytest.mark.slow]
WIDTH, HEIGHT = 640, 480
# The tiny model sees at most 64 image tokens, so cache in small blocks to see them cached.
BLOCK = 32  # the CPU attention backend needs a multiple of 32


@pytest.fixture(scope="module")
def node(tiny_qwen3_vl):
    proc = NodeProcess("cpu_demo", {
        "engine.model": str(tiny_qwen3_vl), "prefill.enabled": True, "prefill.period_s": 0.05,
        **ENDLESS_LIMITS,
        "diagnostics.period_s": 0.2, "image.max_age_s": 60.0,
        "image.qos_reliability": "reliable", "image.qos_depth": 10,
        "engine.extra_args": "'" + json.dumps({"block_size": BLOCK}) + "'"})
    proc.wait_ready()
    yield proc
    proc.stop_cleanly()


@pytest.fixture(scope="module")
def io(node, tiny_qwen3_vl):
    side = SpunNode("prefill_test_io")
    test_node = side.node

    class IO:
        lock = threading.Condition()
        diagnostics: list[dict[str, str]] = []

    io = IO()
    io.camera = test_node.create_publisher(
        Image, "/image", QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))

    def on_diag(msg):
        with io.lock:
            io.diagnostics.append({kv.key: kv.value for kv in msg.status[0].values})
            io.lock.notify_all()

    test_node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    io.set_params = test_node.create_client(SetParameters, "/cosmos_reason/set_parameters")
    io.client = ReasonClient()  # own participant, as a planner's would be
    assert io.client.wait_for_server(DISCOVERY_S) and io.set_params.wait_for_service(NEVER_S)
    assert side.wait_matched(io.camera), "the node's camera subscription was not found"
    io.seed = 100

    def publish_new_frame():
        io.seed += 1
        io.camera.publish(rgb_image_msg(scene(WIDTH, HEIGHT, seed=io.seed),
                                        side.now_ns()))

    def wait_diag(predicate, timeout_s=NEVER_S):
        with io.lock:
            assert io.lock.wait_for(lambda: io.diagnostics and predicate(io.diagnostics[-1]),
                                    timeout_s), io.diagnostics[-1:]
            return dict(io.diagnostics[-1])

    def set_param(name, value: bool | float):
        if isinstance(value, bool):
            typed = ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value)
        else:
            typed = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
        param = Parameter(name=name, value=typed)
        future = io.set_params.call_async(SetParameters.Request(parameters=[param]))
        wait_until(future.done, NEVER_S, f"the node set {name}")
        return future.result().results[0]

    io.publish_new_frame, io.wait_diag, io.set_param = publish_new_frame, wait_diag, set_param
    profile = detect_profile(str(tiny_qwen3_vl))
    io.image_tokens = profile.visual_tokens(*query.input_size(profile, WIDTH, HEIGHT))
    yield io
    io.client.close()
    side.close()


def counter(values, key):
    return int(values[key])


def test_goal_on_a_prefilled_frame_reports_the_image_as_cached(io):
    assert io.set_param("prefill.enabled", True).successful
    before = io.wait_diag(lambda d: d["prefill_enabled"] == "True")
    io.publish_new_frame()
    io.wait_diag(lambda d: counter(d, "prefill_run") > counter(before, "prefill_run"))
    result = io.client.ask("What is on the table?", max_tokens=4)
    assert result.ok, result.error_message
    cached = result.message.cached_prompt_tokens
    # Prefix caching works in whole KV blocks: all of the image's blocks but the one it shares
    # with the question are served from the cache.
    assert cached >= io.image_tokens - BLOCK, (cached, io.image_tokens)
    after = io.wait_diag(lambda d: counter(d, "goals_on_prefilled_frame")
                         > counter(before, "goals_on_prefilled_frame"))
    assert counter(after, "prefill_failed") == 0

    # Control, same run: with prefill off, a goal on a new frame computes the image itself.
    assert io.set_param("prefill.enabled", False).successful
    off = io.wait_diag(lambda d: d["prefill_enabled"] == "False")
    io.publish_new_frame()  # the frame arrives; nothing prefills it
    io.wait_diag(lambda d: counter(d, "frames_received") > counter(off, "frames_received"))
    control = io.client.ask("What is on the table?", max_tokens=4)
    assert control.ok, control.error_message
    assert control.message.cached_prompt_tokens < io.image_tokens - BLOCK <= cached
    assert io.set_param("prefill.enabled", True).successful


def test_no_prefill_starts_while_a_goal_runs(io):
    io.publish_new_frame()
    idle = io.wait_diag(lambda d: d["prefill_enabled"] == "True" and d["goals_active"] == "0")
    # A goal that generates until cancelled, to observe prefill while busy.
    handle = io.client.submit(io.client.goal("Describe the scene.", "vqa",
                                             response_schema=ENDLESS_SCHEMA,
                                             max_tokens=ENDLESS_TOKENS))
    busy = io.wait_diag(lambda d: d["goals_active"] == "1")
    for _ in range(3):  # new frames while the goal generates
        io.publish_new_frame()
        time.sleep(0.05)  # paces: a camera's frames, one after another while the goal runs
    during = io.wait_diag(lambda d: counter(d, "prefill_skipped")
                          > counter(busy, "prefill_skipped"))
    assert not handle.future.done(), "the goal ended before frames arrived: inconclusive"
    handle.cancel()
    assert handle.result(NEVER_S).status == "canceled"
    started_while_busy = (counter(during, "prefill_run") + counter(during, "prefill_aborted")
                          + counter(during, "prefill_failed")) - (
        counter(busy, "prefill_run") + counter(busy, "prefill_aborted")
        + counter(busy, "prefill_failed"))
    assert started_while_busy <= 1 and counter(idle, "prefill_failed") == 0
    # Once idle again, the newest frame is prefilled.
    io.wait_diag(lambda d: counter(d, "prefill_run") > counter(during, "prefill_run"))


def test_ready_frame_answers_from_the_newest_prefilled_frame(io):
    assert io.set_param("prefill.enabled", True).successful
    before = io.wait_diag(lambda d: d["prefill_enabled"] == "True")
    io.publish_new_frame()
    prefilled = io.wait_diag(lambda d: counter(d, "prefill_run") > counter(before, "prefill_run"))
    # A newer frame that nothing prefills (prefill off): the goal would compute its image.
    assert io.set_param("prefill.enabled", False).successful
    io.publish_new_frame()
    io.wait_diag(lambda d: counter(d, "frames_received") > counter(prefilled, "frames_received"))
    assert io.set_param("prefill.ready_frame_within_s", 5.0).successful
    try:
        ready = io.client.ask("What is on the table?", max_tokens=4)
        assert ready.ok, ready.error_message
        assert ready.message.cached_prompt_tokens >= io.image_tokens - BLOCK
        after = io.wait_diag(lambda d: counter(d, "goals_on_ready_frame")
                             > counter(prefilled, "goals_on_ready_frame"))
        assert counter(after, "goals_on_prefilled_frame") > counter(
            prefilled, "goals_on_prefilled_frame")
        # Strict 'latest' (0): the newest frame, not in the caches, one frame period later.
        assert io.set_param("prefill.ready_frame_within_s", 0.0).successful
        newest = io.client.ask("What is on the table?", max_tokens=4)
        assert newest.ok, newest.error_message
        stamp = messages_ns(ready.message.header.stamp)
        assert messages_ns(newest.message.header.stamp) > stamp
        assert newest.message.cached_prompt_tokens < io.image_tokens - BLOCK
    finally:
        io.set_param("prefill.ready_frame_within_s", 0.0)
        io.set_param("prefill.enabled", True)


def messages_ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def test_only_prefill_parameters_change_at_runtime_and_are_checked(io):
    refused = io.set_param("periodic.enabled", True)
    assert not refused.successful and "read-only" in refused.reason
    bad = io.set_param("prefill.ready_frame_within_s", -1.0)
    # The descriptor's range and static type are enforced by rclpy itself, with its wording.
    assert not bad.successful and "out of range" in bad.reason
    wrong_type = io.set_param("prefill.ready_frame_within_s", True)
    assert not wrong_type.successful and "type" in wrong_type.reason.lower()
    assert io.set_param("prefill.enabled", True).successful
