"""The package's Python ``logging`` records, written through the node's ROS logger.

The engines and ``core/`` log with Python ``logging`` (they never import rclpy). Left to
Python, a record reaches stderr only from WARNING up, with no severity, node name or time,
and never ``/rosout``; an engine's "url up" (INFO) is not seen at all. Forwarded, each record
is a line of the node's own logger: same format as the node's lines, on ``/rosout``, and under
the node's ``--log-level``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from rclpy.impl.implementation_singleton import rclpy_implementation

PACKAGE_LOGGER = "cosmos_reason_ros"


class RosLogHandler(logging.Handler):
    """Writes each record to an rclpy logger at the matching severity."""

    def __init__(self, ros_logger: Any) -> None:
        super().__init__(logging.DEBUG)
        self._ros_logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` through the ROS logger."""
        try:
            text = self.format(record)
            if record.levelno >= logging.CRITICAL:
                self._ros_logger.fatal(text)
            elif record.levelno >= logging.ERROR:
                self._ros_logger.error(text)
            elif record.levelno >= logging.WARNING:
                self._ros_logger.warning(text)
            elif record.levelno >= logging.INFO:
                self._ros_logger.info(text)
            else:
                self._ros_logger.debug(text)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def log_line(ros_logger: Any, severity: int, message: str) -> None:
    """Write ``message`` as ``ros_logger``'s ``info``, ``warning``... would, for far less CPU.

    rclpy's logger finds its caller with ``inspect.getframeinfo`` on every call (file-system
    lookups and the source line), for its once/throttle filters: measured 0.50 ms a line on the
    2-core machine against 0.011 ms written straight to rcutils, as this does (same console
    line and ``/rosout``, the caller's function, file and line). For lines written once per
    goal, which need no filter.
    """
    if ros_logger.is_enabled_for(severity):
        caller = sys._getframe(1)
        rclpy_implementation.rclpy_logging_rcutils_log(
            severity, ros_logger.name, message, caller.f_code.co_name, caller.f_code.co_filename,
            caller.f_lineno)


def forward_to(ros_logger: Any) -> RosLogHandler:
    """Send the package's Python log records to ``ros_logger``; undo with :func:`stop_forwarding`.

    The package's Python level follows the ROS logger's (rcutils severities have Python's
    numbers: 10 debug ... 50 fatal), so a record ROS would drop is not even built. Records
    still propagate: with no root handler (a node process) nothing else prints them.
    """
    handler = RosLogHandler(ros_logger)
    package = logging.getLogger(PACKAGE_LOGGER)
    package.addHandler(handler)
    package.setLevel(int(ros_logger.get_effective_level()))
    return handler


def match_vllm_logging(ros_logger: Any, environ: MutableMapping[str, str] = os.environ) -> None:
    """Give vLLM the node's log level, unless the user set ``VLLM_LOGGING_LEVEL`` already.

    vLLM logs through handlers of its own, at the level that variable names when vLLM is
    imported (its engine processes inherit it): without it ``--log-level warn`` would still
    print vLLM's start-up INFO lines. Call before the engine starts.
    """
    environ.setdefault("VLLM_LOGGING_LEVEL",
                       logging.getLevelName(int(ros_logger.get_effective_level())))


def stop_forwarding(handler: RosLogHandler) -> None:
    """Undo :func:`forward_to` (the node is gone: its logger must not be called again)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    package.removeHandler(handler)
    if not package.handlers:
        package.setLevel(logging.NOTSET)
