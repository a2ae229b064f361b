"""Several cameras in one request: images in camera order, named; schemas with a camera enum;
answers mapped back with each camera's own geometry, or reported, never guessed.

Model output is scripted text, so every mapped coordinate is checked exactly against two
cameras of different sizes.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cosmos_reason_ros.core import prompts, query
from cosmos_reason_ros.core.models import COSMOS_REASON1, COSMOS_REASON2
from cosmos_reason_ros.core.types import (
    BadRequestError,
    Box,
    Chunk,
    ErrorCode,
    FinishReason,
    ImageGeometry,
    ParsedAnswer,
    Point,
    PromptTooLongError,
    Task,
    Trajectory,
)

CAMERAS = ("front", "wrist")


def frame(width: int, height: int) -> np.ndarray:
    return np.zeros((height, width, 3), np.uint8)


def two_cameras(profile, front=(640, 480), wrist=(320, 240)) -> query.PreparedMedia:
    return query.combine_cameras([
        ("front", query.prepare_image(profile, frame(*front))),
        ("wrist", query.prepare_image(profile, frame(*wrist)))])


def answer(profile, media: query.PreparedMedia, task: str, text: str, **goal):
    spec = query.make_spec(profile, task=task, **goal)
    out = query.OutputAccumulator()
    out.add(Chunk(text_delta=text, output_tokens=5, finish_reason=FinishReason.STOP))
    return query.finish(profile, spec, media, out)


def text_parts(request) -> list[str]:
    return [p.text for p in request.messages[-1].content if p.kind == "text"]


# --- the request -----------------------------------------------------------------------------

def test_images_come_in_camera_order_then_one_sentence_naming_each():
    media = two_cameras(COSMOS_REASON2)
    spec = query.make_spec(COSMOS_REASON2, task="vqa", prompt="Is the part in the gripper?")
    request = query.build_request("r", COSMOS_REASON2, spec, media)
    user = request.messages[-1]
    assert [p.kind for p in user.content] == ["image", "image", "text"]
    assert [img.shape[:2] for img in request.images] == [(480, 640), (256, 320)]
    (text,) = text_parts(request)
    assert text == ('Image 1 is from the camera "front". Image 2 is from the camera "wrist".\n'
                    "Is the part in the gripper?")


def test_the_model_profile_decides_the_wording():
    profile = dataclasses.replace(COSMOS_REASON2, camera_intro="Picture {index}: {camera}.")
    messages = prompts.build_request_messages(profile, "vqa", "What changed?", n_images=2,
                                              cameras=CAMERAS)
    assert messages[-1].content[-1].text == "Picture 1: front. Picture 2: wrist.\nWhat changed?"


def test_coordinate_tasks_ask_for_the_camera_of_every_entry():
    messages = prompts.build_request_messages(COSMOS_REASON2, "ground", targets=["cup"],
                                              n_images=2, cameras=CAMERAS)
    text = messages[-1].content[-1].text
    assert text.startswith('Image 1 is from the camera "front".')
    assert text.endswith('Add "camera" to every entry: the camera whose image shows it (one '
                         'of "front", "wrist"); its coordinates are in that camera\'s image.')
    verify = prompts.build_request_messages(COSMOS_REASON2, "verify", "Is the bin empty?",
                                            n_images=2, cameras=CAMERAS)
    assert '"camera"' not in verify[-1].content[-1].text  # about the whole scene


def test_one_camera_builds_exactly_the_single_image_request():
    single = query.prepare_image(COSMOS_REASON2, frame(640, 480))
    named = query.combine_cameras([("wrist", single)])
    spec = query.make_spec(COSMOS_REASON2, task="ground", targets=["cup"])
    plain = query.build_request("r", COSMOS_REASON2, spec, single)
    one = query.build_request("r", COSMOS_REASON2, spec, named)
    assert one.messages == plain.messages and one.json_schema == plain.json_schema


def test_the_prefix_of_a_multi_camera_request_starts_with_the_first_cameras_image():
    # A prefill of the first camera's frame (system turn + that image) is a prefix of it.
    media = two_cameras(COSMOS_REASON2)
    spec = query.make_spec(COSMOS_REASON2, task="vqa", prompt="What is there?")
    request = query.build_request("r", COSMOS_REASON2, spec, media)
    prefill = query.build_prefill_request("p", COSMOS_REASON2, query.prepare_image(
        COSMOS_REASON2, frame(640, 480)))
    assert request.messages[0] == prefill.messages[0]
    assert request.messages[1].content[:1] == prefill.messages[1].content
    assert np.array_equal(request.images[0], prefill.images[0])


def test_structured_schemas_require_a_camera_from_the_goals_cameras():
    media = two_cameras(COSMOS_REASON2)
    for task, key in (("ground", "bbox_2d"), ("point", "point_2d"),
                      ("trajectory", "point_2d")):
        goal = {"targets": ["cup"]} if task != "trajectory" else {"prompt": "pick the cup"}
        spec = query.make_spec(COSMOS_REASON2, task=task, **goal)
        items = query.build_request("r", COSMOS_REASON2, spec, media).json_schema["items"]
        assert items["properties"]["camera"] == {"type": "string", "enum": ["front", "wrist"]}
        assert items["required"] == [key, "label", "camera"]
    for task in ("verify", "count"):  # one answer about all images: unchanged
        spec = query.make_spec(COSMOS_REASON2, task=task, prompt="Is it there?",
                               targets=["cup"])
        schema = query.build_request("r", COSMOS_REASON2, spec, media).json_schema
        assert schema == prompts.task_schema(task)
    single = prompts.task_schema(Task.GROUND, ["cup"], cameras=["front"])
    assert "camera" not in single["items"]["properties"]


def test_input_pixel_coordinates_are_bounded_by_the_largest_image():
    media = two_cameras(COSMOS_REASON1, front=(320, 240), wrist=(640, 480))
    spec = query.make_spec(COSMOS_REASON1, task="point", targets=["cup"])
    schema = query.build_request("r", COSMOS_REASON1, spec, media).json_schema
    coordinate = schema["items"]["properties"]["point_2d"]["items"]
    assert coordinate["maximum"] == max(v.geometry.input_width for v in media.views) == 644


def test_more_images_than_the_engine_takes_is_a_bad_request_naming_both_numbers():
    media = two_cameras(COSMOS_REASON2)
    spec = query.make_spec(COSMOS_REASON2, task="vqa", prompt="What is there?")
    with pytest.raises(BadRequestError) as err:
        query.build_request("r", COSMOS_REASON2, spec, media,
                            limits=query.QueryLimits(max_images=1))
    assert "has 2 images; at most 1 fit one request" in err.value.message
    query.build_request("r", COSMOS_REASON2, spec, media, limits=query.QueryLimits(max_images=2))


def test_the_context_check_counts_every_image():
    media = two_cameras(COSMOS_REASON2)  # 640x480 -> 300 tokens, 320x256 -> 80 tokens
    spec = query.make_spec(COSMOS_REASON2, task="vqa", prompt="What is there?")
    with pytest.raises(PromptTooLongError) as err:
        query.build_request("r", COSMOS_REASON2, spec, media,
                            limits=query.QueryLimits(max_model_len=350))
    assert err.value.code is ErrorCode.PROMPT_TOO_LONG
    assert "380 visual tokens (300 (front) + 80 (wrist))" in err.value.message
    assert "engine.max_model_len is 350" in err.value.message
    # One camera alone fits the same context.
    single = query.combine_cameras([("front", query.prepare_image(
        COSMOS_REASON2, frame(640, 480)))])
    query.build_request("r", COSMOS_REASON2, spec, single,
                        limits=query.QueryLimits(max_model_len=350))


def test_camera_names_must_match_the_images():
    with pytest.raises(BadRequestError):
        prompts.build_request_messages(COSMOS_REASON2, "vqa", "Hi", n_images=1,
                                       cameras=CAMERAS)
    clip = query.prepare_clip(COSMOS_REASON2, [frame(64, 48)] * 2, [0, 250_000_000], 4.0)
    with pytest.raises(BadRequestError):
        query.combine_cameras([("front", clip), ("wrist", clip)])


# --- the answer, mapped per camera ------------------------------------------------------------

def test_reason2_boxes_map_to_each_cameras_own_pixels():
    media = two_cameras(COSMOS_REASON2, front=(1280, 720), wrist=(320, 240))
    text = '```json\n' + json.dumps([
        {"bbox_2d": [100, 200, 300, 400], "label": "cup", "camera": "front"},
        {"bbox_2d": [500, 500, 1000, 1000], "label": "cup", "camera": "wrist"},
    ]) + '\n```'
    outcome = answer(COSMOS_REASON2, media, "ground", text, targets=["cup"])
    front, wrist = outcome.boxes
    assert front == Box(128.0, 144.0, 384.0, 288.0, label="cup", camera="front")
    assert wrist == Box(160.0, 120.0, 320.0, 240.0, label="cup", camera="wrist")
    assert outcome.parsed.problems == ()


def test_reason1_input_pixels_map_through_each_cameras_own_resize():
    media = two_cameras(COSMOS_REASON1, front=(640, 480), wrist=(320, 240))
    assert [(v.camera, v.geometry) for v in media.views] == [
        ("front", ImageGeometry(640, 480, 644, 476)),
        ("wrist", ImageGeometry(320, 240, 308, 252))]
    text = json.dumps([
        {"point_2d": [322, 238], "label": "cup", "camera": "front"},
        {"point_2d": [154, 126], "label": "cup", "camera": "wrist"},
        {"point_2d": [644, 476], "label": "bin", "camera": "front"},
    ])
    outcome = answer(COSMOS_REASON1, media, "point", text, targets=["cup", "bin"])
    assert outcome.points == (Point(320.0, 240.0, "cup", "front"),
                              Point(160.0, 120.0, "cup", "wrist"),
                              Point(640.0, 480.0, "bin", "front"))


def test_an_object_without_a_valid_camera_is_a_parse_problem_and_dropped():
    media = two_cameras(COSMOS_REASON2)
    text = json.dumps([
        {"bbox_2d": [0, 0, 500, 500], "label": "cup"},
        {"bbox_2d": [0, 0, 500, 500], "label": "cup", "camera": "rear"},
        {"bbox_2d": [0, 0, 500, 500], "label": "cup", "camera": "Wrist"},
    ])
    outcome = answer(COSMOS_REASON2, media, "ground", text, targets=["cup"])
    # Only the third is kept: "Wrist" is the wrist camera's name, spelled freely.
    assert outcome.boxes == (Box(0.0, 0.0, 160.0, 120.0, label="cup", camera="wrist"),)
    assert 'box 1 names no camera (expected one of "front", "wrist"); dropped' \
        in outcome.parsed.problems
    assert "box 2 names camera 'rear', not one of \"front\", \"wrist\"; dropped" \
        in outcome.parsed.problems


def test_a_trajectory_across_two_cameras_becomes_one_per_camera_each_mapped_in_its_own():
    media = two_cameras(COSMOS_REASON2, front=(1000, 500), wrist=(200, 100))
    text = json.dumps([
        {"point_2d": [100, 100], "label": "gripper trajectory", "camera": "front"},
        {"point_2d": [200, 200], "label": "gripper trajectory", "camera": "front"},
        {"point_2d": [500, 500], "label": "gripper trajectory", "camera": "wrist"},
        {"point_2d": [1000, 1000], "label": "gripper trajectory", "camera": "wrist"},
    ])
    outcome = answer(COSMOS_REASON2, media, "trajectory", text, prompt="pick the cup")
    front, wrist = outcome.trajectories
    label = "gripper trajectory"
    assert front == Trajectory((Point(100.0, 50.0, label, "front"),
                                Point(200.0, 100.0, label, "front")), label, "front")
    assert wrist == Trajectory((Point(100.0, 50.0, label, "wrist"),
                                Point(200.0, 100.0, label, "wrist")), label, "wrist")


def test_a_single_camera_names_every_item_whatever_the_model_wrote():
    media = query.combine_cameras([("wrist", query.prepare_image(COSMOS_REASON2,
                                                                   frame(320, 240)))])
    text = json.dumps([{"bbox_2d": [0, 0, 1000, 1000], "label": "cup", "camera": "rear"},
                       {"bbox_2d": [0, 0, 500, 500], "label": "cup"}])
    outcome = answer(COSMOS_REASON2, media, "ground", text, targets=["cup"])
    assert [b.camera for b in outcome.boxes] == ["wrist", "wrist"]
    assert outcome.parsed.problems == ()


def test_the_parser_keeps_the_camera_the_model_wrote_for_the_mapping_to_check():
    from cosmos_reason_ros.core.parsing import parse_output

    parsed: ParsedAnswer = parse_output(json.dumps([
        {"bbox_2d": [1, 2, 3, 4], "label": "cup", "camera": " front "},
        {"point_2d": [5, 6], "camera": "wrist"},
        {"trajectory": [[1, 1], [2, 2]], "camera": "front", "label": "path"},
    ]))
    assert [b.camera for b in parsed.boxes] == ["front"]
    assert [p.camera for p in parsed.points] == ["wrist"]
    assert parsed.trajectories[0].camera == "front"
    assert {p.camera for p in parsed.trajectories[0].points} == {"front"}
