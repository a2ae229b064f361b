"""The ``query`` command: the client's wait and the goal's time limit are two settings.

The ROS side is a stand-in (``ReasonClient`` and ``rclpy.init`` patched): what is checked is
what the command puts in the goal and how long it waits, not the transport.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
import rclpy  # noqa: E402

from cosmos_reason_ros import client as client_module  # noqa: E402
from cosmos_reason_ros.tools import query  # noqa: E402

pytestmark = [pytest.mark.ros]


class _Result:
    status = "succeeded"
    ok = True
    message = None


class _Client:
    """Records what ``query`` asks of the action client."""

    calls: list[tuple[Any, float | None]] = []
    raises: BaseException | None = None

    def __init__(self, action_name: str) -> None:
        self.action_name = action_name

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, goal: Any, timeout_s: float | None = None, on_feedback: Any = None) -> Any:
        type(self).calls.append((goal, timeout_s))
        if type(self).raises is not None:
            raise type(self).raises
        return _Result()


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[_Client]:
    _Client.calls = []
    _Client.raises = None
    monkeypatch.setattr(client_module, "ReasonClient", _Client)
    monkeypatch.setattr(rclpy, "init", lambda *a, **k: None)
    monkeypatch.setattr(rclpy, "try_shutdown", lambda *a, **k: None)
    monkeypatch.setattr(query, "message_to_dict", lambda msg: {})
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


def test_no_result_in_time_exits_1_saying_the_goal_was_cancelled(
        fake_client, capsys: pytest.CaptureFixture[str]) -> None:
    fake_client.raises = concurrent.futures.TimeoutError()
    assert query.main(["--prompt", "q", "--timeout", "2", "--quiet"]) == 1
    assert "no result within --timeout 2 s; the goal was cancelled" in capsys.readouterr().err


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
