"""The ``~/reason`` action server, noting when each goal's result was asked for.

A stopping node ends its goals and then destroys the action server. A client may ask for a
result only after the goal ended (rclpy's own client pattern asks once the goal response
arrives; on a loaded machine that can be late); a request that reaches a destroyed server is
never answered and the client waits forever. So the node serves result requests until every
goal it ended has been asked for (bounded, ``ReasonNode.serve_results``). rclpy has no public
hook for the result request: ``_execute_get_result_request`` is the same coroutine from Humble
to Kilted (``test/test_humble_api.py`` checks it is there).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from rclpy.action import ActionServer

# The newest goals whose result requests are remembered: far more than can be in flight, so a
# goal ended by a stop is still here (if its result request was pushed out, the stop waits
# its bound for it: slower, never wrong).
RESULT_REQUESTS_KEPT = 4096


class ResultRequestsActionServer(ActionServer):
    """rclpy's ``ActionServer`` that records the time of each goal's result request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._requested: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def result_requests(self, goal_ids: set[bytes]) -> dict[bytes, float]:
        """Return when the results of ``goal_ids`` were asked for (monotonic times)."""
        with self._lock:
            return {g: self._requested[g] for g in goal_ids if g in self._requested}

    async def _execute_get_result_request(self, request_header_and_message: Any) -> None:
        goal_id = bytes(request_header_and_message[1].goal_id.uuid)
        with self._lock:
            self._requested[goal_id] = time.monotonic()
            self._requested.move_to_end(goal_id)
            while len(self._requested) > RESULT_REQUESTS_KEPT:
                self._requested.popitem(last=False)
        await super()._execute_get_result_request(request_header_and_message)
