"""The plain form of a message: nested dicts and lists with the message's field names.

One form for every place a result leaves as data: replay's JSONL and results bag, ``query``'s
JSON, the console's WebSocket. Works on rclpy messages and on ``rosbags`` dataclasses alike
(duck-typed, so core imports neither). Floats that JSON cannot carry (NaN, e.g. a
``Box2D.score`` the model did not give; infinities) become ``None``, so the output is strict
JSON.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def to_plain(msg: Any) -> Any:
    """Convert a ROS message (rclpy or rosbags) or value to nested dicts/lists."""
    if isinstance(msg, float):
        return msg if math.isfinite(msg) else None
    if isinstance(msg, (str, bool, int)) or msg is None:
        return msg
    if isinstance(msg, (np.floating, np.integer, np.bool_)):
        return to_plain(msg.item())
    if isinstance(msg, (bytes, bytearray)):
        return list(msg)
    if isinstance(msg, np.ndarray):
        return [to_plain(v) for v in msg.tolist()]
    if hasattr(msg, "get_fields_and_field_types"):  # rclpy message
        return {name: to_plain(getattr(msg, name)) for name in msg.get_fields_and_field_types()}
    if dataclasses.is_dataclass(msg):  # rosbags message; ROS constants are UPPER_CASE
        return {f.name: to_plain(getattr(msg, f.name)) for f in dataclasses.fields(msg)
                if not f.name.startswith("__") and not f.name.isupper()}
    if isinstance(msg, Sequence) or hasattr(msg, "tolist"):  # list, tuple, array.array
        return [to_plain(v) for v in msg]
    raise TypeError(f"cannot convert a {type(msg).__name__} to plain data")
