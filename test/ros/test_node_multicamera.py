"""Several named cameras through the node, in the fast tier (the real node, a scripted engine).

What the core tests (test/core/test_multicamera_*.py) cannot show: the ``cameras.*``
parameters checked at start, one subscription per camera on its own relative topic, frames
arriving over DDS into each camera's history, the engine's image limit derived from the
cameras, and the per-camera outputs (``~/<camera>/annotated_image``, detections, diagnostics).
The real-engine test at the end proves both images reach vLLM.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Script  # noqa: E402
from inprocess_node import BASE_PARAMS, InProcessNode  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from waiting import DISCOVERY_S, NEVER_S, wait_until  # noqa: E402

from cosmos_reason_interfaces.action import Reason  # noqa: E402
from cosmos_reason_ros.config import ConfigError, validate  # noqa: E402
from cosmos_reason_ros.core.annotate import draw_annotations  # noqa: E402
from cosmos_reason_ros.core.models import COSMOS_REASON2  # noqa: E402
from cosmos_reason_ros.core.pipeline import Settings  # noqa: E402
from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros]
Goal = Reason.Goal
NS = 1_000_000_000
CAMERAS = {"cameras.names": ["front", "wrist"]}
# Each camera its own size and shade, so the request's images and the drawings tell them apart.
FRONT = {"width": 320, "height": 240, "value": 40, "frame_id": "front_optical"}
WRIST = {"width": 160, "height": 128, "value": 200, "frame_id": "wrist_optical"}
GROUND_ANSWER = json.dumps([  # Cosmos-Reason2 boxes: 0-1000 per axis of each camera's image
    {"bbox_2d": [250, 500, 750, 1000], "label": "cup", "camera": "front"},
    {"bbox_2d": [0, 0, 500, 500], "label": "cup", "camera": "wrist"},
])


@pytest.fixture
def make_node():
    nodes: list[InProcessNode] = []

    def make(params=None, script=None) -> InProcessNode:
        node = InProcessNode({**CAMERAS, **(params or {})}, script)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def publish_both(n: InProcessNode, wrist_offset_ns: int = 10_000_000) -> tuple[int, int]:
    """Publish one frame per camera, the wrist's ``wrist_offset_ns`` after the front's."""
    front = n.publish(camera="front", **FRONT)
    wrist = n.publish(front + wrist_offset_ns, camera="wrist", **WRIST)
    n.wait_frames(1, camera="front")
    n.wait_frames(1, camera="wrist")
    return front, wrist


def stamp_ns(header: Any) -> int:
    return header.stamp.sec * NS + header.stamp.nanosec


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    wait_until(predicate, timeout_s, what)


# --- parameters ----------------------------------------------------------------------------


def params(**values: Any) -> Any:
    return validate({"engine.model": "fake-model", **values})


@pytest.mark.parametrize("names, words", [
    (["front", "front"], "[1]='front' is listed twice"),
    (["front", "wrist cam"], "[1]='wrist cam' is not a ROS name token"),
    (['"front"'], "'\"front\"' is not a ROS name token"),
    (["front/left"], "is not a ROS name token"),
    (["1st"], "'1st' is not a ROS name token"),
    (["a__b"], "is not a ROS name token"),
    ([""], "[0]='' is empty"),
    ([f"cam{i}" for i in range(17)], "17 cameras; allowed at most 16"),
])
def test_bad_camera_names_stop_the_node_naming_the_value(names, words):
    with pytest.raises(ConfigError) as e:
        params(**{"cameras.names": names})
    assert "cameras.names" in str(e.value) and words in str(e.value)


def test_inputs_need_one_allowed_kind_per_camera():
    with pytest.raises(ConfigError, match=r"cameras.inputs=\['raw'\]: has 1 entries for 2"):
        params(**{"cameras.names": ["front", "wrist"], "cameras.inputs": ["raw"]})
    with pytest.raises(ConfigError, match=r"cameras.inputs.*\[1\]='jpeg': allowed: each item "
                                          r"one of raw, compressed, both"):
        params(**{"cameras.names": ["front", "wrist"], "cameras.inputs": ["raw", "jpeg"]})
    with pytest.raises(ConfigError, match=r"cameras.max_skew_s=-0.1: allowed: >= 0.0"):
        params(**{"cameras.max_skew_s": -0.1})


def test_the_engine_takes_one_image_per_camera_unless_the_user_set_its_limit():
    three = params(**{"cameras.names": ["front", "wrist", "rear"]})
    assert json.loads(three.engine.limit_mm_per_prompt) == {"image": 3, "video": 1}
    limits = Settings.from_params(three, COSMOS_REASON2).limits
    assert (limits.images_per_request, limits.max_model_len) == (3, 8192)
    assert params().engine.limit_mm_per_prompt == '{"image": 1, "video": 1}'  # one camera
    # A value the user set stays (e.g. a Jetson Nano's single image).
    nano = params(**{"cameras.names": ["front", "wrist"],
                     "engine.limit_mm_per_prompt": '{"image": 1}'})
    assert Settings.from_params(nano, COSMOS_REASON2).limits.images_per_request == 1
    # A server's context is its own: no node-side context check for the openai engine.
    remote = params(**{"engine.kind": "openai"})
    assert Settings.from_params(remote, COSMOS_REASON2).limits.max_model_len == 0


# --- goals ---------------------------------------------------------------------------------


def test_a_two_camera_goal_sends_both_images_and_maps_each_box_to_its_camera(make_node):
    n = make_node(script=lambda r: Script(deltas=[GROUND_ANSWER]))
    front_ns, wrist_ns = publish_both(n)
    status, result = n.ask(task="ground", targets=["cup"], cameras=["front", "wrist"])
    assert status == GoalStatus.STATUS_SUCCEEDED, result.error_message
    request = n.engine.requests[-1]
    # Both images, in the goal's order, each at its own model size with its own pixels.
    assert [int(img[0, 0, 0]) for img in request.images] == [40, 200]
    assert [img.shape[:2] for img in request.images] == [
        (f.input_height, f.input_width) for f in result.camera_frames]
    assert request.messages[-1].content[-1].text.startswith(
        'Image 1 is from the camera "front". Image 2 is from the camera "wrist".')
    # Each box in its own camera's original pixels, named.
    assert [(b.camera, b.x_min, b.y_min, b.x_max, b.y_max) for b in result.boxes] == [
        ("front", 80.0, 120.0, 240.0, 240.0), ("wrist", 0.0, 0.0, 80.0, 64.0)]
    frames = [(f.camera, f.header.frame_id, stamp_ns(f.header), f.image_width, f.image_height)
              for f in result.camera_frames]
    assert frames == [("front", "front_optical", front_ns, 320, 240),
                      ("wrist", "wrist_optical", wrist_ns, 160, 128)]
    assert [s.sec * NS + s.nanosec for s in result.frame_stamps] == [front_ns, wrist_ns]
    assert (result.header.frame_id, stamp_ns(result.header)) == ("front_optical", front_ns)


def test_a_goal_naming_no_camera_asks_about_the_first_camera_alone(make_node):
    n = make_node(script=lambda r: Script(deltas=["A cup."]))
    front_ns, _ = publish_both(n)
    status, result = n.ask(prompt="What is on the table?")
    assert status == GoalStatus.STATUS_SUCCEEDED
    request = n.engine.requests[-1]
    assert len(request.images) == 1 and int(request.images[0][0, 0, 0]) == 40
    assert "from the camera" not in request.messages[-1].content[-1].text
    assert [(f.camera, stamp_ns(f.header)) for f in result.camera_frames] == [("front",
                                                                                front_ns)]
    status, result = n.ask(prompt="And here?", cameras=["wrist"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    assert int(n.engine.requests[-1].images[0][0, 0, 0]) == 200
    assert [f.camera for f in result.camera_frames] == ["wrist"]


def test_frames_too_far_apart_wait_for_a_matching_set_then_fail_naming_the_skew(make_node):
    n = make_node()
    publish_both(n, wrist_offset_ns=-NS // 2)  # the wrist frame 0.5 s before the front one
    feedback: list[Any] = []
    status, result = n.ask(feedback, prompt="Is the part in the gripper?",
                           cameras=["front", "wrist"], wait_for_image_s=0.3)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == ErrorCode.NO_IMAGE
    message = result.error_message
    assert "no frames of cameras front, wrist within cameras.max_skew_s=0.1 s" in message
    assert "after waiting 0.30 s" in message and "the closest set is 0.500 s apart" in message
    assert "waiting_for_image" in [fb.stage for fb in feedback]
    assert not n.engine.requests


def test_a_skewed_goal_succeeds_when_a_matching_frame_arrives_during_the_wait(make_node):
    n = make_node()
    front_ns, _ = publish_both(n, wrist_offset_ns=-NS // 2)
    waiting = threading.Event()
    handle = n.send_async(
        Goal(prompt="Is the part in the gripper?", cameras=["front", "wrist"],
             wait_for_image_s=20.0, max_image_age_s=30.0),
        feedback_callback=lambda fb: fb.feedback.stage == "waiting_for_image" and waiting.set())
    wait_for(handle.done, what="goal acceptance")
    assert waiting.wait(NEVER_S), "the goal never waited for an image"
    wrist_ns = n.publish(front_ns + 20_000_000, camera="wrist", **WRIST)
    status, result = n.result(handle.result())
    assert status == GoalStatus.STATUS_SUCCEEDED, result.error_message
    assert [stamp_ns(f.header) for f in result.camera_frames] == [front_ns, wrist_ns]


@pytest.mark.parametrize("extra, cameras, code, words", [
    ({}, ["front", "rear"], ErrorCode.BAD_REQUEST,
     "cameras[1]='rear' is not a configured camera; configured cameras: front, wrist"),
    ({}, ["wrist", "wrist"], ErrorCode.BAD_REQUEST, "'wrist' twice"),
    ({"engine.limit_mm_per_prompt": '{"image": 1}'}, ["front", "wrist"],
     ErrorCode.BAD_REQUEST, "2 cameras, but one request takes at most 1 images"),
    ({}, ["front", "wrist"], ErrorCode.NO_IMAGE,
     "no image received on camera 'wrist' yet"),
])
def test_camera_problems_end_the_goal_with_a_specific_error(make_node, extra, cameras, code,
                                                           words):
    n = make_node(extra)
    n.publish(camera="front", **FRONT)  # the wrist camera never publishes
    n.wait_frames(1, camera="front")
    status, result = n.ask(prompt="Q?", cameras=cameras, wait_for_image_s=0.2)
    assert status == GoalStatus.STATUS_ABORTED
    assert result.error_code == code and words in result.error_message, result.error_message
    assert not n.engine.requests


def test_each_camera_takes_its_own_input_kind_on_its_own_relative_topics(make_node):
    n = make_node({"cameras.inputs": ["both", "compressed"]})
    assert n.node.cameras.by_name["front"].topics == "/front/image, /front/image/compressed"
    assert n.node.cameras.by_name["wrist"].topics == "/wrist/image/compressed"
    assert list(n.node.pipeline.cameras) == ["front", "wrist"]


# --- outputs -------------------------------------------------------------------------------


class _Collector:
    """Messages of one topic, received on the test side."""

    def __init__(self, n: InProcessNode, topic: str) -> None:
        self.messages: list[Image] = []
        self.cond = threading.Condition()
        n.side.node.create_subscription(Image, topic, self._on, 5)

    def _on(self, msg: Image) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def first(self, timeout_s: float = 10.0) -> Image:
        with self.cond:
            assert self.cond.wait_for(lambda: self.messages, timeout_s), "no message"
            return self.messages[0]


def as_rgb(msg: Image) -> np.ndarray:
    return np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.width, 3)


def test_each_camera_gets_its_annotated_image_with_its_own_boxes_and_header(make_node):
    n = make_node(script=lambda r: Script(deltas=[GROUND_ANSWER]))
    topics = {"front": "/cosmos_reason/front/annotated_image",
              "wrist": "/cosmos_reason/wrist/annotated_image",
              "default": "/cosmos_reason/annotated_image"}
    got = {name: _Collector(n, topic) for name, topic in topics.items()}
    outputs = n.node.outputs
    wait_for(lambda: all(p.get_subscription_count() for p in (
        outputs.camera_annotated["front"], outputs.camera_annotated["wrist"],
        outputs.annotated)), what="annotated image subscriptions")
    front_ns, wrist_ns = publish_both(n)
    status, result = n.ask(task="ground", targets=["cup"], cameras=["wrist", "front"])
    assert status == GoalStatus.STATUS_SUCCEEDED, result.error_message
    for name, frame, stamp in (("front", FRONT, front_ns), ("wrist", WRIST, wrist_ns)):
        msg = got[name].first()
        assert (msg.header.frame_id, stamp_ns(msg.header)) == (frame["frame_id"], stamp)
        plain = np.full((frame["height"], frame["width"], 3), frame["value"], np.uint8)
        expected = draw_annotations(plain, [b for b in result.boxes if b.camera == name],
                                    title=result.answer)
        assert np.array_equal(as_rgb(msg), expected), f"{name}: not its own boxes drawn"
    # ~/annotated_image stays the default (first configured) camera's.
    default = got["default"].first()
    assert default.header.frame_id == "front_optical"
    assert np.array_equal(as_rgb(default), as_rgb(got["front"].first()))


class _Recorder:
    """A publisher stand-in that keeps what it is given."""

    def __init__(self) -> None:
        self.published: list[Any] = []

    def publish(self, msg: Any) -> None:
        self.published.append(msg)


def test_each_camera_gets_detections_of_its_boxes_with_its_frame_header(make_node):
    # vision_msgs is not installable here: the 4.x stand-in of test_detections.py takes its
    # place, with recording publishers (where vision_msgs exists the node creates real ones).
    from test_detections import STAND_IN

    n = make_node(script=lambda r: Script(deltas=[GROUND_ANSWER]))
    outputs = n.node.outputs
    outputs._vision_msgs = STAND_IN
    outputs.detections = _Recorder()
    outputs.camera_detections = {"front": _Recorder(), "wrist": _Recorder()}
    front_ns, wrist_ns = publish_both(n)
    status, result = n.ask(task="ground", targets=["cup"], cameras=["front", "wrist"])
    assert status == GoalStatus.STATUS_SUCCEEDED
    for name, frame_id, stamp, index in (("front", "front_optical", front_ns, 0),
                                         ("wrist", "wrist_optical", wrist_ns, 1)):
        [array] = outputs.camera_detections[name].published
        assert (array.header.frame_id, stamp_ns(array.header)) == (frame_id, stamp)
        assert [d.id for d in array.detections] == [f"{result.goal_id}/{index}"]
        assert array.detections[0].header.frame_id == frame_id
    [default] = outputs.detections.published  # ~/detections: the default camera's
    assert [d.id for d in default.detections] == [f"{result.goal_id}/0"]


def test_diagnostics_report_every_camera_and_a_silent_one(make_node):
    from cosmos_reason_ros.ros.diagnostics import node_status

    n = make_node()
    n.publish(camera="front", **FRONT)
    n.wait_frames(1, camera="front")
    status = node_status(n.node.report())
    values = {kv.key: kv.value for kv in status.values}
    assert (values["front.frames_received"], values["wrist.frames_received"]) == ("1", "0")
    assert values["front.frame_age_s"] != "" and values["wrist.frame_age_s"] == ""
    assert values["frames_received"] == "1"  # the default camera's, as before
    assert status.level == status.ERROR and "no camera wrist frames yet" in status.message
    assert "camera front" not in status.message


def test_a_node_without_named_cameras_keeps_one_default_camera_on_image():
    n = InProcessNode(script=lambda r: Script(deltas=["ok"]))
    try:
        assert list(n.node.pipeline.cameras) == ["default"]
        assert n.node.camera.topics == "/image"
        assert not n.node.outputs.camera_annotated
        assert n.node.params.engine.limit_mm_per_prompt == BASE_PARAMS.get(
            "engine.limit_mm_per_prompt", '{"image": 1, "video": 1}')
        n.publish()
        n.wait_frames(1)
        status, result = n.ask(prompt="Q?")
        assert status == GoalStatus.STATUS_SUCCEEDED
        assert [f.camera for f in result.camera_frames] == ["default"]
    finally:
        n.close()


def test_the_client_asks_about_named_cameras_and_reads_each_items_camera(make_node):
    from cosmos_reason_ros.client import ReasonClient

    n = make_node(script=lambda r: Script(deltas=[GROUND_ANSWER]))
    with ReasonClient(context=n.context) as client:
        assert client.wait_for_server(DISCOVERY_S)
        publish_both(n)
        result = client.ground(["cup"], cameras=["front", "wrist"], max_image_age_s=60.0,
                               timeout_s=NEVER_S)
        assert result.ok, result.error_message
        assert result.cameras == ("front", "wrist")
        assert [(b.camera, b.x_max, b.y_max) for b in result.boxes] == [
            ("front", 240.0, 240.0), ("wrist", 80.0, 64.0)]
        with pytest.raises(TypeError, match=r"cameras='front,wrist': give a list"):
            client.goal("q", cameras="front,wrist")


# --- the real engine -----------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.slow
def test_a_two_camera_goal_reaches_the_real_engine_with_both_images(tiny_qwen3_vl):
    """What only this proves: vLLM itself takes and tokenizes both cameras' images.

    The node process starts from an unchanged preset (cpu_demo) with two named cameras; the
    engine's image limit is raised to two (vLLM refuses a second image otherwise), and the
    prompt grows by exactly the second image's visual tokens as counted by vLLM.
    """
    from node_process import NodeProcess, rgb_image_msg, scene
    from rclpy.duration import Duration
    from spun_node import SpunNode

    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.core.models import detect_profile

    proc = NodeProcess("cpu_demo", {"engine.model": str(tiny_qwen3_vl),
                                    "cameras.names": ["front", "wrist"],
                                    "image.qos_reliability": "reliable", "image.qos_depth": 10,
                                    "image.max_age_s": 120.0})
    side = client = None
    try:
        proc.wait_ready()
        assert "images_per_request=2" in proc.output
        side = SpunNode("multicamera_engine_test")
        cameras = {name: side.node.create_publisher(Image, f"/{name}/image", 10)
                   for name in ("front", "wrist")}
        assert all(side.wait_matched(p) for p in cameras.values()), "cameras not matched"
        client = ReasonClient()

        def publish_pair(wrist_size: tuple[int, int]) -> int:
            stamp = side.now_ns()
            cameras["front"].publish(rgb_image_msg(scene(640, 480, 1), stamp, "front_optical"))
            cameras["wrist"].publish(rgb_image_msg(scene(*wrist_size, 2), stamp,
                                                   "wrist_optical"))
            for publisher in cameras.values():  # reliable: acknowledged = in the history
                assert publisher.wait_for_all_acked(Duration(seconds=NEVER_S))
            return stamp

        def ask(names: list[str]) -> Any:
            result = client.ask("What is on the table?", cameras=names, max_tokens=4,
                                greedy=True, timeout_s=NEVER_S)
            assert result.ok, result.error_message
            return result.message

        # A small wrist view, then a larger one (20 and 54 visual tokens for the tiny model,
        # whose pixel budget is 64 tokens).
        stamp = publish_pair((160, 120))
        both, front_only = ask(["front", "wrist"]), ask(["front"])
        assert [(f.camera, f.header.frame_id, stamp_ns(f.header))
                for f in both.camera_frames] == [("front", "front_optical", stamp),
                                                 ("wrist", "wrist_optical", stamp)]
        profile = detect_profile(str(tiny_qwen3_vl))

        def wrist_tokens(msg: Any) -> int:
            wrist = msg.camera_frames[1]
            return profile.visual_tokens(wrist.input_width, wrist.input_height)

        # The second image and its one-sentence introduction.
        assert both.prompt_tokens - front_only.prompt_tokens >= wrist_tokens(both)
        publish_pair((320, 240))
        larger = ask(["front", "wrist"])
        assert (larger.camera_frames[1].image_width, larger.camera_frames[1].image_height) \
            == (320, 240)
        # Same text, same front image: the prompt differs by the wrist images' tokens alone.
        assert larger.prompt_tokens - both.prompt_tokens \
            == wrist_tokens(larger) - wrist_tokens(both) > 0
    finally:
        if client is not None:
            client.close()
        if side is not None:
            side.close()
        code = proc.stop()
    assert code == 0, proc.output[-3000:]
