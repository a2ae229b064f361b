"""Scenario files: validation with errors that name the field, and schedule expansion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmos_reason_ros.eval.scenario import (
    MAX_SCHEDULED,
    ScenarioError,
    build_schedule,
    load_scenario,
    parse_scenario,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def doc(*queries, **top):
    return {"queries": list(queries), **top}


def q(**fields):
    return {"name": "q", "at": 0.0, **fields}


def test_a_full_query_is_parsed_with_defaults_applied():
    s = parse_scenario(doc(
        {"name": "g", "every": 1.0, "start": 0.5, "task": "GROUND",
         "targets": ["red box", " "], "expect": {"kind": "box_iou", "threshold": 0.4}},
        q(name="v", at=[2.0, 1.0], task="verify", prompt="It is red.", max_tokens=12,
          response_schema={"type": "object"}, expect=[{"kind": "yes_no", "value": True},
                                                      {"kind": "regex", "value": "^y",
                                                       "informational": True}]),
        defaults={"max_tokens": 64, "greedy": True}, name="shelf"))
    g, v = s.queries
    assert s.name == "shelf" and s.fail_on_error and s.scored
    assert g.goal.task == "ground" and g.goal.targets == ("red box",)
    assert g.goal.max_tokens == 64 and g.goal.greedy  # from defaults
    assert v.goal.max_tokens == 12  # a query's own value wins
    assert json.loads(v.goal.response_schema) == {"type": "object"}
    assert v.at == (1.0, 2.0)
    # box_iou with one target and no label: the target is the label, ground truth the box
    assert g.expect[0].label == "red box" and g.expect[0].box is None
    assert g.expect[0].threshold == 0.4
    assert v.expect[0].value == "yes"  # YAML's bare yes (a boolean) means "yes"
    assert v.expect[1].informational and not v.expect[1].ignore_case  # regex: case matters


@pytest.mark.parametrize(("raw", "message"), [
    ([], "expected a mapping"),
    ({"queries": []}, "queries: expected a non-empty list"),
    (doc(q(), bogus=1), "unknown field(s) bogus"),
    (doc(q(task="dance")), "queries[0].task='dance': allowed"),
    (doc({"name": "q"}), "give exactly one of 'at'"),
    (doc(q(every=1.0)), "give exactly one of 'at'"),
    (doc({"name": "q", "every": 0}), "queries[0].every=0.0: expected a finite number > 0"),
    (doc(q(at=-1)), "queries[0].at=-1.0"),
    (doc(q(at=[])), "queries[0].at: the list is empty"),
    (doc(q(start=1.0)), "queries[0].start: only used with 'every'"),
    (doc({"name": "q", "every": 1, "start": 2, "end": 1}), "end=1: must not be before"),
    (doc(q(source="yesterday")), "queries[0].source='yesterday': allowed latest, next, clip"),
    (doc(q(targets=[1])), "queries[0].targets: expected a list of strings"),
    (doc(q(max_tokens=-3)), "queries[0].max_tokens=-3"),
    (doc(q(max_tokens=True)), "queries[0].max_tokens=True"),
    (doc(q(temperature="hot")), "queries[0].temperature='hot': expected a number"),
    (doc(q(greedy="yes")), "queries[0].greedy='yes': expected true or false"),
    (doc(q(response_schema="{oops")), "queries[0].response_schema: not valid JSON"),
    (doc(q(), q()), "queries[1].name='q': names must be unique"),
    (doc(q(name="")), "queries[0].name: must not be empty"),
    (doc(q(expect={"kind": "fuzzy"})), "queries[0].expect[0].kind='fuzzy': allowed"),
    (doc(q(expect=["contains"])), "queries[0].expect[0]: expected a mapping"),
    (doc(q(expect={"kind": "contains"})), "queries[0].expect[0].value: contains needs"),
    (doc(q(expect={"kind": "regex", "value": "(["})), "not a valid regular expression"),
    (doc(q(expect={"kind": "yes_no", "value": "maybe"})), "value='maybe': allowed yes, no"),
    (doc(q(expect={"kind": "exact", "value": "a", "field": "mood"})), "field='mood'"),
    (doc(q(expect={"kind": "exact", "value": "a", "threshold": 0.5})),
     "expect[0].threshold: only used with kind"),
    (doc(q(expect={"kind": "box_iou"})), "expect[0].label: box_iou against the ground truth"),
    (doc(q(expect={"kind": "box_iou", "box": [0, 0, 1]})), "expect[0].box=[0, 0, 1]"),
    (doc(q(expect={"kind": "box_iou", "box": [5, 0, 1, 9]})), "need x_min < x_max"),
    (doc(q(expect={"kind": "box_iou", "label": "a", "threshold": 0})),
     "expect[0].threshold=0.0: expected a finite number > 0, <= 1"),
    (doc(q(expect={"kind": "box_iou", "label": "a", "value": "x"})),
     "expect[0].value: not used with kind box_iou"),
    (doc(q(), version=2), "version=2: only version 1"),
])
def test_invalid_scenarios_name_the_field(raw, message):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(raw)
    assert message in str(info.value)


def test_schedule_is_time_ordered_with_every_expanded_inclusively():
    s = parse_scenario(doc(
        q(name="late", at=[1.5, 0.2]),
        {"name": "tick", "every": 0.5, "start": 0.5},
        {"name": "window", "every": 0.3, "start": 0.1, "end": 0.7}))
    schedule = build_schedule(s, 2.0)
    assert [(x.t_s, x.key) for x in schedule] == [
        (0.1, "window#0"), (0.2, "late#0"), (0.4, "window#1"), (0.5, "tick#0"),
        (0.7, "window#2"), (1.0, "tick#1"), (1.5, "late#1"), (1.5, "tick#2"), (2.0, "tick#3")]


def test_schedule_rejects_times_past_the_recording():
    s = parse_scenario(doc(q(at=[1.0, 5.0])))
    with pytest.raises(ScenarioError, match=r"at=5 s is past the end of the recording \(4"):
        build_schedule(s, 4.0)
    s = parse_scenario(doc({"name": "q", "every": 1.0, "end": 9.0}))
    with pytest.raises(ScenarioError, match="end=9 s is past the end"):
        build_schedule(s, 4.0)


def test_schedule_is_bounded():
    s = parse_scenario(doc({"name": "q", "every": 0.001}))
    with pytest.raises(ScenarioError, match=f"at most {MAX_SCHEDULED}"):
        build_schedule(s, 100.0)


def test_files_load_and_report_yaml_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("queries: [\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    good = tmp_path / "mine.yaml"
    good.write_text("queries:\n  - {name: a, at: 0, prompt: hi}\n")
    s = load_scenario(good)
    assert s.name == "mine" and s.path == str(good)  # the file name when none is given


def test_the_demo_scenario_is_valid_and_fits_the_demo_recording():
    s = load_scenario(REPO_ROOT / "config" / "scenarios" / "demo.yaml")
    schedule = build_schedule(s, 4.0)
    assert {x.query.goal.source for x in schedule} == {"latest", "next", "clip"}
    assert {x.query.goal.task for x in schedule} >= {"ground", "verify"}
    # Only expectations every model meets (schema-guaranteed structure) may regress.
    for query in s.queries:
        for e in query.expect:
            assert e.informational or e.field == "answer_json", (query.name, e)
