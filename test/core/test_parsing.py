"""Tests for core/parsing.py: the output hazards its docstring lists, each shape, never-raises."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosmos_reason_ros.core import parsing
from cosmos_reason_ros.core.parsing import (
    find_json,
    parse_output,
    parse_timestamp,
    read_count,
    read_verdict,
    split_reasoning,
)
from cosmos_reason_ros.core.types import Box, FinishReason, ParsedAnswer, Point, Task

# --- reasoning / answer split ---------------------------------------------------------------


def test_reason2_think_then_fenced_json_after_close_tag():
    text = (
        "<think>\nThe red cup is on the left.\n</think>\n\n"
        '```json\n[{"bbox_2d": [100, 200, 300, 400], "label": "red cup"}]\n```'
    )
    out = parse_output(text)
    assert out.reasoning == "The red cup is on the left."
    assert out.answer.startswith("```json")
    assert out.boxes == (Box(100, 200, 300, 400, label="red cup"),)
    assert out.answer_json == '[{"bbox_2d":[100,200,300,400],"label":"red cup"}]'
    assert out.found == ("reasoning", "json", "boxes")
    assert out.problems == ()
    assert not out.truncated
    assert out.raw_text == text


def test_json_inside_think_block_is_ignored():
    text = (
        '<think>\nMaybe {"bbox_2d": [1, 2, 3, 4], "label": "wrong"} or [5, 6, 7, 8]?\n'
        "```json\n[9, 9, 9, 9]\n```\n</think>\n\n"
        '{"bbox_2d": [10, 20, 30, 40], "label": "right"}'
    )
    out = parse_output(text)
    assert [b.label for b in out.boxes] == ["right"]
    assert out.boxes[0] == Box(10, 20, 30, 40, label="right")
    assert "wrong" in out.reasoning


def test_think_block_json_ignored_even_when_answer_has_no_json():
    out = parse_output('<think>{"bbox_2d": [1, 2, 3, 4]}</think>\nI cannot see a cup.')
    assert out.boxes == ()
    assert out.answer_json is None
    assert out.answer == "I cannot see a cup."
    assert "json" not in out.found


def test_reason1_answer_tags():
    text = (
        "<think>\nThe gripper is closed around the part.\n</think>\n\n"
        "<answer>\nYes, the part was picked up.\n</answer>"
    )
    out = parse_output(text)
    assert out.reasoning == "The gripper is closed around the part."
    assert out.answer == "Yes, the part was picked up."
    assert "yes_no" in out.found
    assert read_verdict(out) is True
    assert not out.truncated


def test_reason1_answer_tags_with_json_inside():
    text = '<think>a</think>\n<answer>\n[{"bbox_2d": [1, 2, 30, 40], "label": "bolt"}]\n</answer>'
    out = parse_output(text)
    assert out.boxes == (Box(1, 2, 30, 40, label="bolt"),)


def test_missing_think_open_tag_but_close_present():
    # Qwen3 templates often put <think> in the prompt, so only </think> is generated.
    out = parse_output('The cup is at [5,5].\n</think>\n\n{"point_2d": [500, 250], "label": "cup"}')
    assert out.reasoning == "The cup is at [5,5]."
    assert out.points == (Point(500, 250, label="cup"),)


def test_no_tags_whole_text_is_answer():
    out = parse_output("  A forklift blocks the aisle.  ")
    assert out.reasoning == ""
    assert out.answer == "A forklift blocks the aisle."
    assert out.found == ()
    assert out.problems == ()


def test_unclosed_think_means_cut_in_reasoning():
    out = parse_output('<think>\nLet me look: {"bbox_2d": [1,2,3,4]} and then', finish_reason=None)
    assert out.answer == ""
    assert out.reasoning.startswith("Let me look")
    assert out.boxes == ()
    assert out.truncated
    assert any("</think>" in p for p in out.problems)


def test_unclosed_answer_tag_is_truncated():
    out = parse_output("<think>r</think><answer>The aisle is bl")
    assert out.answer == "The aisle is bl"
    assert out.truncated
    assert any("</answer>" in p for p in out.problems)


def test_given_reasoning_means_text_is_answer():
    out = parse_output(
        '{"bbox_2d": [1, 2, 3, 4]}', reasoning='I think {"bbox_2d": [9, 9, 9, 9]} is wrong.'
    )
    assert out.reasoning.startswith("I think")
    assert out.boxes == (Box(1, 2, 3, 4),)
    assert "reasoning" in out.found


def test_given_reasoning_with_stray_close_tag_in_text():
    out = parse_output("more thoughts [1,2,3,4]</think>No.", reasoning="server part")
    assert out.answer == "No."
    assert out.boxes == ()
    assert "server part" in out.reasoning and "more thoughts" in out.reasoning
    assert read_verdict(out) is False


# A server started with --reasoning-parser qwen3 and asked without a think prompt can put the
# whole output in its reasoning channel and leave content empty.
_BOX_ANSWER = '[{"bbox_2d": [100, 200, 300, 400], "label": "red cup"}]'


def test_structured_answer_only_in_the_reasoning_channel_is_recovered_and_noted():
    out = parse_output("", reasoning=_BOX_ANSWER, task=Task.GROUND)
    assert out.boxes == (Box(100, 200, 300, 400, label="red cup"),)
    assert any("reasoning channel" in p and "--reasoning-parser" in p for p in out.problems)


def test_answer_after_the_reasoning_channels_last_close_tag_is_taken():
    reasoning = "The cup is left. </think> no wait </think>\n" + _BOX_ANSWER
    out = parse_output("", reasoning=reasoning, task=Task.GROUND)
    assert out.boxes == (Box(100, 200, 300, 400, label="red cup"),)
    assert out.reasoning.startswith("The cup is left.") and "bbox_2d" not in out.reasoning
    assert any("reasoning channel (the content channel was empty)" in p for p in out.problems)


def test_point_answer_in_the_reasoning_channel_is_recovered():
    out = parse_output("  ", reasoning='{"point_2d": [500, 500], "label": "cup"}', task=Task.POINT)
    assert out.points == (Point(500, 500, label="cup"),)
    assert any("reasoning channel" in p for p in out.problems)


def test_content_without_the_expected_answer_falls_back_to_the_reasoning_channel():
    out = parse_output("Here it is.", reasoning="</think>" + _BOX_ANSWER, task=Task.GROUND)
    assert len(out.boxes) == 1
    assert any("content channel held no answer" in p for p in out.problems)


def test_content_answer_wins_over_json_in_the_reasoning_channel():
    out = parse_output('{"bbox_2d": [1, 2, 3, 4]}', reasoning=_BOX_ANSWER, task=Task.GROUND)
    assert out.boxes == (Box(1, 2, 3, 4),)
    assert not any("reasoning channel" in p for p in out.problems)


def test_free_text_answer_after_close_tag_in_the_reasoning_channel_is_recovered():
    out = parse_output("", reasoning="thinking</think>The aisle is clear.", task=Task.VQA)
    assert out.answer == "The aisle is clear." and out.reasoning == "thinking"
    assert any("reasoning channel" in p for p in out.problems)


def test_free_text_reasoning_without_an_answer_notes_the_empty_answer():
    out = parse_output("", reasoning="The aisle looks clear to me.", task=Task.VQA)
    assert out.answer == ""
    assert any("answer empty" in p and "reasoning channel" in p for p in out.problems)


def test_reasoning_channel_without_the_expected_answer_changes_nothing():
    out = parse_output("", reasoning="I cannot see a cup.", task=Task.GROUND)
    assert out.boxes == () and out.answer == ""
    assert not any("taken from" in p for p in out.problems)
    assert "no boxes found in the answer" in out.problems  # never a silent "nothing found"


def test_end_of_turn_token_stripped():
    assert parse_output("Yes.<|im_end|>").answer == "Yes."


def test_split_reasoning_is_public_and_tuple_shaped():
    split = split_reasoning("<think>a</think>b")
    assert (split.reasoning, split.answer, split.truncated) == ("a", "b", False)


# --- JSON finding ---------------------------------------------------------------------------


def test_bare_fence_without_language_tag():
    out = parse_output('Here:\n```\n{"box_2d": [1, 2, 3, 4], "label": "cup"}\n```\nDone.')
    assert out.boxes == (Box(1, 2, 3, 4, label="cup"),)


def test_json_embedded_in_prose():
    out = parse_output('The object is {"bbox_2d": [10, 10, 50, 60], "label": "box"} I think.')
    assert out.boxes == (Box(10, 10, 50, 60, label="box"),)


def test_several_json_objects_in_a_row_become_a_list():
    out = parse_output(
        '{"bbox_2d": [1, 2, 3, 4], "label": "a"}\n{"bbox_2d": [5, 6, 7, 8], "label": "b"}'
    )
    assert [b.label for b in out.boxes] == ["a", "b"]
    assert json.loads(out.answer_json) == [
        {"bbox_2d": [1, 2, 3, 4], "label": "a"},
        {"bbox_2d": [5, 6, 7, 8], "label": "b"},
    ]


def test_prose_brackets_are_not_json():
    out = parse_output("The robot [arm] is near {the table}.")
    assert out.answer_json is None
    assert out.problems == ()


def test_truncated_json_is_repaired_and_incomplete_value_dropped():
    text = (
        '<think>ok</think>```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "cup"}, '
        '{"bbox_2d": [5, 6, 7, 8], "label": "mu'
    )
    out = parse_output(text, finish_reason=FinishReason.LENGTH)
    assert out.truncated
    assert out.boxes == (Box(1, 2, 3, 4, label="cup"), Box(5, 6, 7, 8))  # partial label dropped
    assert any("JSON truncated" in p and "repaired" in p for p in out.problems)
    assert any("max_tokens" in p for p in out.problems)
    assert json.loads(out.answer_json)[1] == {"bbox_2d": [5, 6, 7, 8]}


def test_truncated_inside_box_numbers_reports_short_box():
    out = parse_output('[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [5, 6, 7')
    assert out.boxes == (Box(1, 2, 3, 4),)
    # the trailing "7" may be the start of "712": it is dropped, leaving 2 numbers
    assert "box 2 has 2 numbers (expected 4)" in out.problems
    assert out.truncated


def test_truncation_without_finish_reason_still_flags_truncated():
    out = parse_output('{"point_2d": [1, 2], "label": "a"')
    assert out.truncated
    assert out.points == (Point(1, 2, label="a"),)  # complete string kept, object closed
    out = parse_output('{"point_2d": [1, 2], "label": "grip')
    assert out.truncated
    assert out.points == (Point(1, 2),)  # the label was cut before its closing quote: dropped


def test_finish_reason_length_sets_truncated_even_if_parse_is_clean():
    out = parse_output("<think>a</think>Yes", finish_reason=FinishReason.LENGTH)
    assert out.truncated


def test_finish_reason_length_in_reasoning_explained():
    out = parse_output("<think>a long thought", finish_reason=FinishReason.LENGTH)
    assert out.truncated
    assert any("before any answer" in p for p in out.problems)


def test_single_quotes_and_trailing_commas_repaired():
    out = parse_output("[{'bbox_2d': [1, 2, 3, 4,], 'label': 'cup',},]")
    assert out.boxes == (Box(1, 2, 3, 4, label="cup"),)
    assert "JSON repaired: single-quoted string" in out.problems
    assert "JSON repaired: trailing comma" in out.problems
    assert out.answer_json == '[{"bbox_2d":[1,2,3,4],"label":"cup"}]'


def test_unquoted_keys_and_python_literals():
    out = parse_output("{answer: 'yes', confident: True, note: None}")
    assert json.loads(out.answer_json) == {"answer": "yes", "confident": True, "note": None}
    assert read_verdict(out) is True


def test_find_json_public_helper():
    found = find_json('a [1, 2] b {"c": "d"}')
    assert found.values == ([1, 2], {"c": "d"})
    assert not found.truncated


def test_string_escapes_and_surrogate_pairs():
    out = parse_output(r'{"label": "a\"b\\c\n\u00e9\ud83d\ude00", "x": 1, "y": 2}')
    assert out.points == (Point(1, 2, label='a"b\\c\né😀'),)


def test_chinese_text_round_trips():
    text = (
        "<think>\n杯子在桌子的左边。\n</think>\n\n"
        '```json\n[{"bbox_2d": [12, 34, 560, 780], "label": "红色杯子"}]\n```'
    )
    out = parse_output(text)
    assert out.reasoning == "杯子在桌子的左边。"
    assert out.boxes[0].label == "红色杯子"
    assert "红色杯子" in out.answer_json  # ensure_ascii=False
    assert json.loads(out.answer_json)[0]["label"] == "红色杯子"


def test_chinese_yes_no():
    assert read_verdict("是的，零件已经被抓起来了。") is True
    assert read_verdict("不是，夹爪是空的。") is False
    assert read_verdict("没有。") is False


def test_huge_numbers_do_not_break_json_or_boxes():
    digits = "9" * 5000  # beyond Python's int-string conversion limit
    out = parse_output(f'{{"bbox_2d": [1, 2, {digits}, 1e999], "n": {digits}}}')
    assert out.boxes == ()
    assert "box 1 has a non-finite number; dropped" in out.problems
    data = json.loads(out.answer_json)  # valid JSON: no Infinity
    assert data["bbox_2d"][3] is None


def test_deep_nesting_is_bounded():
    out = parse_output("[" * 5000 + "]" * 5000)
    assert any("deeper than" in p for p in out.problems)


# --- boxes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["bbox_2d", "box_2d", "bbox", "box", "BBox_2D"])
def test_box_key_drift(key):
    out = parse_output(f'[{{"{key}": [1, 2, 3, 4], "label": "cup"}}]')
    assert out.boxes == (Box(1, 2, 3, 4, label="cup"),)


@pytest.mark.parametrize("label_key", ["label", "name", "object", "class"])
def test_label_keys(label_key):
    out = parse_output(f'{{"bbox_2d": [1, 2, 3, 4], "{label_key}": "mug"}}')
    assert out.boxes[0].label == "mug"


def test_scores_from_score_or_confidence():
    out = parse_output(
        '[{"bbox_2d": [1, 2, 3, 4], "score": 0.9}, {"bbox_2d": [1, 2, 3, 4], "confidence": "0.5"},'
        ' {"bbox_2d": [1, 2, 3, 4], "score": "high"}]'
    )
    assert [b.score for b in out.boxes] == [0.9, 0.5, None]
    assert any("box 3 score" in p for p in out.problems)


def test_numbers_as_strings():
    out = parse_output('{"bbox_2d": ["10", "20.5", " 30 ", "4e1"], "label": "x"}')
    assert out.boxes == (Box(10, 20.5, 30, 40, label="x"),)


def test_box_as_one_string():
    out = parse_output('{"bbox_2d": "(10, 20), (30, 40)"}')
    assert out.boxes == (Box(10, 20, 30, 40),)


def test_plain_four_number_list_and_list_of_them():
    assert parse_output("[1, 2, 3, 4]").boxes == (Box(1, 2, 3, 4),)
    assert parse_output("[[1, 2, 3, 4], [5, 6, 7, 8]]").boxes == (Box(1, 2, 3, 4), Box(5, 6, 7, 8))


def test_label_dict_of_boxes():
    out = parse_output('{"cup": [1, 2, 3, 4], "mug": [[5, 6, 7, 8], [9, 10, 11, 12]]}')
    assert out.boxes == (
        Box(1, 2, 3, 4, label="cup"),
        Box(5, 6, 7, 8, label="mug"),
        Box(9, 10, 11, 12, label="mug"),
    )


def test_non_geometry_lists_in_nested_dicts_are_not_boxes():
    out = parse_output(
        '{"answer": "yes", "details": {"rgb": [255, 0, 0, 255], "size": [640, 480]}}'
    )
    assert out.boxes == () and out.points == ()


def test_boxes_nested_under_a_key():
    out = parse_output('{"objects": [{"bbox_2d": [1, 2, 3, 4], "label": "a"}], "count": 1}')
    assert out.boxes == (Box(1, 2, 3, 4, label="a"),)


def test_one_label_several_boxes():
    out = parse_output('{"bbox_2d": [[1, 2, 3, 4], [5, 6, 7, 8]], "label": "screw"}')
    assert out.boxes == (Box(1, 2, 3, 4, label="screw"), Box(5, 6, 7, 8, label="screw"))


def test_corner_keys():
    out = parse_output('{"x1": 1, "y1": 2, "x2": 3, "y2": 4, "label": "a"}')
    assert out.boxes == (Box(1, 2, 3, 4, label="a"),)


def test_bad_boxes_are_reported_not_raised():
    out = parse_output(
        '[{"bbox_2d": [1, 2, 3]}, {"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": "left"},'
        ' {"bbox_2d": [1, "x", 3, 4]}]'
    )
    assert out.boxes == (Box(1, 2, 3, 4),)
    assert "box 1 has 3 numbers (expected 4)" in out.problems
    assert any(p.startswith("box 3 is not a list of numbers") for p in out.problems)
    assert any(p.startswith("box 4 is not a list of numbers") for p in out.problems)


def test_qwen_text_box_tokens_with_and_without_label():
    text = (
        "<|object_ref_start|>the red cup<|object_ref_end|><|box_start|>(10,20),(300,400)"
        "<|box_end|> and <|box_start|>(1.5, 2),(3,4)<|box_end|>"
    )
    out = parse_output(text)
    assert out.boxes == (Box(10, 20, 300, 400, label="the red cup"), Box(1.5, 2, 3, 4))
    assert "boxes" in out.found


def test_qwen_text_box_inside_reasoning_ignored():
    out = parse_output("<think><|box_start|>(1,2),(3,4)<|box_end|></think>none")
    assert out.boxes == ()


def test_ground_task_without_boxes_is_a_problem_not_an_error():
    out = parse_output("I do not see any cup.", task=Task.GROUND)
    assert out.boxes == ()
    assert "no boxes found in the answer" in out.problems


# --- points and trajectories ----------------------------------------------------------------


def test_point_objects_default_to_points():
    out = parse_output(
        '[{"point_2d": [1, 2], "label": "cup"}, {"point_2d": [3, 4], "label": "mug"}]'
    )
    assert out.points == (Point(1, 2, label="cup"), Point(3, 4, label="mug"))
    assert out.trajectories == ()


def test_xy_point_and_points_key():
    assert parse_output('{"x": 5, "y": 6, "label": "a"}').points == (Point(5, 6, label="a"),)
    assert parse_output('{"points": [7, 8], "label": "b"}').points == (Point(7, 8, label="b"),)
    assert parse_output('{"point": ["1", "2"]}').points == (Point(1, 2),)


def test_mission_trajectory_shape_by_label():
    text = (
        "<think>The gripper should move right.</think>\n```json\n"
        '[{"point_2d": [100, 200], "label": "gripper trajectory"},'
        ' {"point_2d": [150, 220], "label": "gripper trajectory"},'
        ' {"point_2d": [200, 240], "label": "gripper trajectory"}]\n```'
    )
    out = parse_output(text)
    assert len(out.trajectories) == 1
    traj = out.trajectories[0]
    assert traj.label == "gripper trajectory"
    assert [(p.x, p.y) for p in traj.points] == [(100, 200), (150, 220), (200, 240)]
    assert out.points == ()
    assert "trajectories" in out.found


def test_trajectory_task_turns_point_objects_into_trajectory():
    text = '{"point_2d": [1, 2], "label": "a"}\n{"point_2d": [3, 4], "label": "a"}'
    default = parse_output(text)
    assert len(default.points) == 2 and default.trajectories == ()
    out = parse_output(text, task=Task.TRAJECTORY)
    assert out.points == ()
    assert [(p.x, p.y) for p in out.trajectories[0].points] == [(1, 2), (3, 4)]


def test_trajectory_task_grouping():
    text = (
        '[{"point_2d": [1, 2], "label": "start"}, {"point_2d": [3, 4], "label": "grasp"},'
        ' {"point_2d": [5, 6], "label": "end"}]'
    )
    out = parse_output(text, task=Task.TRAJECTORY)
    assert len(out.trajectories) == 1
    assert [p.label for p in out.trajectories[0].points] == ["start", "grasp", "end"]
    two_arms = (
        '[{"point_2d": [1, 2], "label": "left"}, {"point_2d": [3, 4], "label": "right"},'
        ' {"point_2d": [5, 6], "label": "left"}, {"point_2d": [7, 8], "label": "right"}]'
    )
    out = parse_output(two_arms, task=Task.TRAJECTORY)
    assert [(t.label, len(t.points)) for t in out.trajectories] == [("left", 2), ("right", 2)]


def test_point_task_keeps_trajectory_labelled_points_separate():
    text = '[{"point_2d": [1, 2], "label": "path"}, {"point_2d": [3, 4], "label": "path"}]'
    out = parse_output(text, task=Task.POINT)
    assert len(out.points) == 2 and out.trajectories == ()


def test_trajectory_key_and_points_key():
    out = parse_output('{"trajectory": [[1, 2], [3, 4], {"x": 5, "y": 6}], "label": "arm"}')
    assert [(p.x, p.y) for p in out.trajectories[0].points] == [(1, 2), (3, 4), (5, 6)]
    assert out.trajectories[0].label == "arm"
    out = parse_output('{"points": [[1, 2], [3, 4]]}')
    assert len(out.trajectories) == 1 and len(out.trajectories[0].points) == 2
    out = parse_output('{"points": [[1, 2], [3, 4]]}', task="point")
    assert out.points == (Point(1, 2), Point(3, 4))


def test_bare_pairs_points_or_trajectory_by_task():
    assert parse_output("[[1, 2], [3, 4]]").points == (Point(1, 2), Point(3, 4))
    out = parse_output("[[1, 2], [3, 4]]", task=Task.TRAJECTORY)
    assert len(out.trajectories) == 1


def test_trajectory_with_bad_point_reports_it():
    out = parse_output('{"trajectory": [[1, 2], [3], [5, 6]]}')
    assert [(p.x, p.y) for p in out.trajectories[0].points] == [(1, 2), (5, 6)]
    assert any("has 1 number" in p for p in out.problems)


# --- temporal spans -------------------------------------------------------------------------


def test_temporal_spans():
    text = (
        '```json\n[{"start": "00:01.50", "end": "00:03.25", "caption": "The arm picks the cup."},'
        ' {"start": 4, "end": "01:02:03.5", "caption": "它放下了杯子"},'
        ' {"start": "00:09", "end": "00:07", "caption": "backwards"}]\n```'
    )
    out = parse_output(text, task=Task.TEMPORAL)
    assert [(s.start_s, s.end_s) for s in out.spans] == [(1.5, 3.25), (4.0, 3723.5), (7.0, 9.0)]
    assert out.spans[1].caption == "它放下了杯子"
    assert "span 3 ends before it starts; swapped" in out.problems
    assert "spans" in out.found


def test_bad_span_time_reported():
    out = parse_output('{"start": "soon", "end": "00:02"}')
    assert out.spans == ()
    assert any("span 1 has an unreadable time" in p for p in out.problems)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("00:01.50", 1.5),
        ("1:05", 65.0),
        ("01:00:00.25", 3600.25),
        ("12.5", 12.5),
        ("3s", 3.0),
        (7, 7.0),
        (2.5, 2.5),
        ("-1", None),
        (-3, None),
        ("abc", None),
        (True, None),
        (math.nan, None),
        (None, None),
    ],
)
def test_parse_timestamp(value, seconds):
    assert parse_timestamp(value) == seconds


# --- yes / no -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"answer": "yes", "reason": "closed gripper"}', True),
        ('{"answer": "No", "reason": "empty"}', False),
        ('```json\n{"verdict": true}\n```', True),
        ("**Yes.** The part is in the gripper.", True),
        ("no, it fell", False),
        ("Nothing is in the gripper.", None),
        ("The answer is yes.", None),
        ("", None),
    ],
)
def test_read_verdict(text, verdict):
    out = parse_output(text, task=Task.VERIFY)
    assert read_verdict(out) is verdict
    assert ("yes_no" in out.found) is (verdict is not None)


def test_verify_without_verdict_is_reported():
    out = parse_output("Hard to say.", task=Task.VERIFY)
    assert "no yes/no verdict found in the answer" in out.problems


# --- counts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "answer_json"),
    [
        ('{"count": 3}', 3, '{"count":3}'),
        ('```json\n{"count": 0}\n```', 0, '{"count":0}'),
        ('<think>2 red cups and 3 blue ones, so 5.</think>\n\n{"count": 5}', 5, '{"count":5}'),
        ('<think>x</think><answer>{"Count": "4"}</answer>', 4, '{"Count":"4"}'),  # Reason1
        ('{"total": 2.0}', 2, '{"total":2.0}'),
        ('[{"label": "cup", "count": 2}, {"label": "plate", "count": 1}]', 3, None),
        # Prose only: the count becomes the result's JSON.
        ("3", 3, '{"count":3}'),
        ("There are 3 red cups on the table; 3 in all.", 3, '{"count":3}'),
        ("<think>maybe 4, maybe 6</think>I can see two cups.", 2, '{"count":2}'),
        ("货架上有3个杯子。", 3, '{"count":3}'),
    ],
)
def test_count_answers_are_read(text, count, answer_json):
    out = parse_output(text, task=Task.COUNT)
    assert read_count(out) == count
    assert "count" in out.found
    if answer_json is not None:
        assert out.answer_json == answer_json
    assert not any("count" in p for p in out.problems)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"count": -1}', "count -1 is not a whole number in 0..2147483647"),
        ('{"count": 2.5}', "count 2.5 is not a whole number"),
        ('{"count": "many"}', "count 'many' is not a whole number"),
        ('{"count": true}', "count True is not a whole number"),
        ('{"count": 1e12}', "count 1000000000000.0 is not a whole number"),
        ('[{"count": 2}, {"count": -2}]', "count -2 is not a whole number"),
        ('{"cups": 3}', None),
        ("I see 2 cups and 3 plates.", "count is ambiguous: the answer names several numbers "
                                       "(2, 3)"),
        ("About 2.5 cups.", None),
        ("I cannot tell.", None),
    ],
)
def test_bad_count_answers_are_problems_not_errors(text, problem):
    out = parse_output(text, task=Task.COUNT)
    assert read_count(out) is None
    assert "count" not in out.found
    assert "no count found in the answer" in out.problems
    if problem is not None:
        assert any(p.startswith(problem) for p in out.problems), out.problems


def test_count_cut_at_max_tokens_is_truncated_without_a_count():
    # The number itself may be cut ("1" of "12"), so a repaired JSON keeps no count.
    out = parse_output('<think>x</think>{"count": 1', task=Task.COUNT,
                       finish_reason=FinishReason.LENGTH)
    assert out.truncated and read_count(out) is None
    assert "no count found in the answer" in out.problems
    cut_in_reasoning = parse_output("<think>There are 3", task=Task.COUNT,
                                    finish_reason=FinishReason.LENGTH)
    assert cut_in_reasoning.truncated and read_count(cut_in_reasoning) is None
    assert cut_in_reasoning.answer_json is None
    fenced = parse_output('```json\n{"count": 4}', task=Task.COUNT)  # fence never closed
    assert fenced.truncated and read_count(fenced) == 4


def test_prose_counts_are_read_only_for_the_count_task():
    # Other tasks keep their answers as they were: no count, no JSON made up.
    for task in (None, Task.VQA, Task.VERIFY):
        out = parse_output("There are 3 cups.", task=task)
        assert "count" not in out.found and out.answer_json is None
    assert read_count("There are 3 cups.") == 3  # the helper still reads prose


@settings(max_examples=100, deadline=None, database=None)
@given(n=st.integers(0, 1000), fence=st.booleans(),
       reasoning=st.text(st.characters(blacklist_characters="<>"), max_size=30))
def test_any_schema_shaped_count_round_trips(n, fence, reasoning):
    body = json.dumps({"count": n})
    text = f"```json\n{body}\n```" if fence else body
    out = parse_output(f"<think>{reasoning}</think>{text}", task=Task.COUNT)
    assert read_count(out) == n
    assert json.loads(out.answer_json) == {"count": n}


# --- never raises ---------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "```json\n",
        "```",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        ",",
        ":",
        "\\",
        "\\u",
        "\\ud83d",
        '"bbox_2d"',
        '"point_2d"',
        '"label"',
        '"start"',
        '"end"',
        "1e999",
        "-",
        ".",
        "NaN",
        "Infinity",
        "9" * 40,
        "true",
        "nul",
        "<|box_start|>",
        "<|box_end|>",
        "<|object_ref_start|>",
        "(1,2),(3,4)",
        "杯子",
        "是",
        "\x00",
        "\ud800",
        " ",
        "\n",
        "yes",
        "no",
    ]
)


def _check(out: ParsedAnswer, text: str) -> None:
    assert isinstance(out, ParsedAnswer)
    assert out.raw_text == text
    if out.answer_json is not None:
        json.loads(out.answer_json)
    for b in out.boxes:
        assert all(math.isfinite(v) for v in (b.x_min, b.y_min, b.x_max, b.y_max))
    for p in out.points + tuple(q for t in out.trajectories for q in t.points):
        assert math.isfinite(p.x) and math.isfinite(p.y)
    assert not any("internal parser error" in p for p in out.problems)


@settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(text=st.text(max_size=300), finish=st.sampled_from([None, *FinishReason]))
def test_never_raises_on_arbitrary_text(text, finish):
    _check(parse_output(text, finish_reason=finish), text)


@settings(max_examples=200, deadline=None, database=None)
@given(
    parts=st.lists(_FRAGMENTS | st.text(max_size=5) | st.integers().map(str), max_size=40),
    task=st.sampled_from([None, *Task]),
)
def test_never_raises_on_adversarial_fragments(parts, task):
    text = "".join(parts)
    _check(parse_output(text, task=task, reasoning=None), text)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["bbox_2d", "point_2d", "label", "start", "end", "x", "y", "points", "k"]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


_JSON_KEYS = st.sampled_from(["bbox_2d", "point_2d", "label", "start", "end", "x", "y", "k"])
_JSON_CONTAINERS = st.lists(_JSON_VALUES, max_size=4) | st.dictionaries(
    _JSON_KEYS, _JSON_VALUES, max_size=4
)


@settings(max_examples=100, deadline=None, database=None)
@given(value=_JSON_CONTAINERS, cut=st.integers(0, 400))
def test_valid_json_round_trips_and_any_prefix_is_safe(value, cut):
    text = json.dumps(value, ensure_ascii=False)
    out = parse_output("<think>x</think>" + text)
    assert json.loads(out.answer_json) == value
    prefix = text[:cut]
    _check(parse_output(prefix), prefix)


def test_internal_errors_become_problems(monkeypatch):
    def boom(*_args, **_kwargs):
        raise RuntimeError("bug")

    monkeypatch.setattr(parsing, "_parse", boom)
    out = parse_output("<think>a</think>b")
    assert out.answer == "<think>a</think>b"
    assert out.problems == ("internal parser error: RuntimeError: bug",)


def test_non_string_input_does_not_raise():
    assert parse_output(None).answer == ""  # type: ignore[arg-type]
