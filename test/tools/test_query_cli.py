"""The ``query`` command: the client's wait and the goal's time limit are two settings.

The ROS side is a stand-in (``ReasonClient`` and ``rclpy.init`` patched): what is checked is
what the command puts in the goal and how long it waits, not the transport.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
import rclpy  # noqa: E402

from cosmos_reason_ros import client as client_module  # noqa: E402
from cosmos_reason_ros.tools import query  # noqa: E402

pytestmark = [pytest.mark.ros]


class _Result:
    def __init__(self, status: str = "succeeded") -> None:
        self.status, self.ok, self.message = status, status == "succeeded", None


class _Handle:
    """A goal that ends as the test says: at once, never (until cancelled), or never at all."""

    def __init__(self, outcome: str) -> None:
        self.outcome = outcome  # "succeeded", "held" (ends canceled when cancelled), "lost"
        self.sent = outcome != "unsent"
        self.cancelled = False
        self.waits: list[float | None] = []

    def result(self, timeout_s: float | None = None) -> _Result:
        self.waits.append(timeout_s)
        if self.outcome == "succeeded":
            return _Result()
        if self.outcome == "held" and self.cancelled:
            return _Result("canceled")
        raise concurrent.futures.TimeoutError()

    def cancel(self) -> None:
        self.cancelled = True

    def delivery(self) -> str:
        return "accepted, no result"


class _Client:
    """Records what ``query`` asks of the action client."""

    calls: list[tuple[Any, float | None]] = []
    handles: list[_Handle] = []
    outcome = "succeeded"

    def __init__(self, action_name: str) -> None:
        self.action_name = action_name

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, goal: Any, on_feedback: Any = None,
               server_timeout_s: float | None = None) -> _Handle:
        type(self).calls.append((goal, server_timeout_s))
        type(self).handles.append(_Handle(type(self).outcome))
        return type(self).handles[-1]


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[_Client]:
    _Client.calls = []
    _Client.handles = []
    _Client.outcome = "succeeded"
    monkeypatch.setattr(client_module, "ReasonClient", _Client)
    monkeypatch.setattr(rclpy, "init", lambda *a, **k: None)
    monkeypatch.setattr(rclpy, "try_shutdown", lambda *a, **k: None)
    monkeypatch.setattr(query, "to_plain", lambda msg: {})
    return _Client


def test_timeout_is_the_clients_wait_not_the_goals_limit(fake_client) -> None:
    assert query.main(["--prompt", "q", "--timeout", "5", "--quiet"]) == 0
    ((goal, wait_s),) = fake_client.calls
    assert wait_s == 5.0
    assert goal.timeout_s == 0.0  # the node's limits.goal_timeout_s


def test_goal_timeout_sets_the_goals_limit_only(fake_client) -> None:
    assert query.main(["--prompt", "q", "--goal-timeout", "30", "--quiet"]) == 0
    ((goal, wait_s),) = fake_client.calls
    assert goal.timeout_s == 30.0
    assert wait_s == query.WAIT_S  # the default wait outlasts the node's default limit
    assert query.WAIT_S > 120.0


def test_no_result_in_time_cancels_and_prints_the_nodes_reply_as_json(
        fake_client, capsys: pytest.CaptureFixture[str]) -> None:
    fake_client.outcome = "held"
    assert query.main(["--prompt", "q", "--timeout", "2", "--quiet"]) == 1
    (handle,) = fake_client.handles
    assert handle.cancelled and handle.waits == [2.0, query.CANCEL_REPLY_S]
    out = capsys.readouterr()
    assert json.loads(out.out) == {"status": "canceled"}
    assert "no result within --timeout 2 s: cancelling the goal" in out.err


def test_no_reply_to_the_cancel_exits_1_with_the_clients_view(
        fake_client, capsys: pytest.CaptureFixture[str]) -> None:
    fake_client.outcome = "lost"
    assert query.main(["--prompt", "q", "--timeout", "2", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"no reply to the cancel within {query.CANCEL_REPLY_S:g} s" in err
    assert "accepted, no result" in err


def test_a_server_never_found_is_named_and_the_goal_never_sent(
        fake_client, capsys: pytest.CaptureFixture[str]) -> None:
    fake_client.outcome = "unsent"
    assert query.main(["--prompt", "q", "--timeout", "2", "--quiet"]) == 1
    (handle,) = fake_client.handles
    assert handle.cancelled  # so that it is not sent if the server shows up now
    err = capsys.readouterr().err
    assert "action server /cosmos_reason/reason not available after 2 s" in err


def test_help_offers_every_task_of_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    from cosmos_reason_ros.core.tasks import TASKS

    with pytest.raises(SystemExit):
        query.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(task.value in text for task in TASKS) and "count" in text


def test_help_tells_the_two_timeouts_apart(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        query.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--goal-timeout S the goal's own limit (its timeout_s)" in text
    assert "--timeout S how long this command waits" in text
    assert "0 (default) = the node's limits.goal_timeout_s" in text


def test_cameras_go_into_the_goal_in_the_order_given(fake_client) -> None:
    assert query.main(["--prompt", "q", "--cameras", "wrist, front", "--quiet"]) == 0
    ((goal, _),) = fake_client.calls
    assert list(goal.cameras) == ["wrist", "front"]
    assert query.main(["--prompt", "q", "--quiet"]) == 0
    assert list(fake_client.calls[-1][0].cameras) == []  # the node's default camera


@pytest.mark.parametrize("argv, words", [
    (["--cameras", "front,,wrist"], "--cameras 'front,,wrist': an empty name"),
    (["--cameras", "front", "--image", "x.jpg"], "give one of them"),
])
def test_bad_cameras_are_usage_errors(fake_client, capsys: pytest.CaptureFixture[str],
                                      argv: list[str], words: str) -> None:
    with pytest.raises(SystemExit) as e:
        query.main(["--prompt", "q", *argv])
    assert e.value.code == 2
    assert words in capsys.readouterr().err
    assert not fake_client.calls
