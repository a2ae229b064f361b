"""The package's Python log records reach the node's ROS logger at their own severity."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from waiting import NEVER_S

from cosmos_reason_ros.ros.pylog import forward_to, stop_forwarding


class Recorder:
    """An rclpy-logger stand-in: records (severity, text); its effective level is given."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.lines: list[tuple[str, str]] = []

    def get_effective_level(self) -> int:
        return self.level

    def __getattr__(self, severity: str):
        return lambda text: self.lines.append((severity, text))


@pytest.fixture
def engine_log():
    return logging.getLogger("cosmos_reason_ros.engines.openai_http")


def test_records_go_to_the_ros_logger_at_their_severity_until_stopped(engine_log) -> None:
    ros = Recorder(logging.INFO)
    handler = forward_to(ros)
    try:
        engine_log.debug("probe answered")  # below the node's level: not even built
        engine_log.info("url up: url=%s", "http://a:8000/v1")
        engine_log.warning("url down: url=%s reason=%s", "http://a:8000/v1", "refused")
        engine_log.error("boom")
        engine_log.critical("dead")
    finally:
        stop_forwarding(handler)
    engine_log.warning("after the node is gone")
    assert ros.lines == [("info", "url up: url=http://a:8000/v1"),
                         ("warning", "url down: url=http://a:8000/v1 reason=refused"),
                         ("error", "boom"), ("fatal", "dead")]
    assert logging.getLogger("cosmos_reason_ros").level == logging.NOTSET


def test_the_python_level_follows_a_real_ros_loggers_level(engine_log) -> None:
    rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
    from rclpy.logging import LoggingSeverity

    ros_logger = rclpy.logging.get_logger("pylog_test")
    ros_logger.set_level(LoggingSeverity.DEBUG)
    handler = forward_to(ros_logger)
    try:
        assert engine_log.isEnabledFor(logging.DEBUG)
        ros_logger.set_level(LoggingSeverity.WARN)
        stop_forwarding(handler)
        handler = forward_to(ros_logger)
        assert not engine_log.isEnabledFor(logging.INFO)
        assert engine_log.isEnabledFor(logging.WARNING)
    finally:
        stop_forwarding(handler)


def test_vllm_gets_the_nodes_level_unless_the_user_chose_one() -> None:
    from cosmos_reason_ros.ros.pylog import match_vllm_logging

    environ: dict[str, str] = {}
    match_vllm_logging(Recorder(logging.WARNING), environ)
    assert environ == {"VLLM_LOGGING_LEVEL": "WARNING"}
    environ = {"VLLM_LOGGING_LEVEL": "DEBUG"}
    match_vllm_logging(Recorder(logging.ERROR), environ)
    assert environ == {"VLLM_LOGGING_LEVEL": "DEBUG"}


@pytest.mark.slow  # a process of its own: rcutils reads its output format once per process
def test_log_line_writes_the_line_rclpys_logger_writes(tmp_path) -> None:
    pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
    script = tmp_path / "goal_log.py"
    script.write_text(
        "import rclpy\n"
        "from rclpy.logging import LoggingSeverity\n"
        "from cosmos_reason_ros.ros.pylog import log_line\n"
        "logger = rclpy.logging.get_logger('pylog_line')\n"
        "def end_goal():\n"
        "    log_line(logger, LoggingSeverity.INFO, 'goal 1 succeeded')\n"
        "    log_line(logger, LoggingSeverity.DEBUG, 'below the level: not written')\n"
        "    logger.info('goal 1 succeeded')\n"
        "end_goal()\n")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=NEVER_S, check=True,
        env={**os.environ, "RCUTILS_CONSOLE_OUTPUT_FORMAT":
             "{severity} {name} {function_name} {file_name}:{line_number} {message}"})
    assert done.stderr.splitlines() == [
        f"INFO pylog_line end_goal {script}:6 goal 1 succeeded",
        f"INFO pylog_line end_goal {script}:8 goal 1 succeeded"]
