"""The one interface every inference backend implements.

Engines are asyncio objects: all their coroutines run on one event loop that the engine's
owner (``runner.EngineRunner``) keeps in a dedicated thread. ROS callbacks never call these
coroutines directly; they go through the runner's thread-safe methods.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass

from cosmos_reason_ros.core.types import ChatRequest, Chunk


class EngineState(str, enum.Enum):
    """Lifecycle of an engine, as reported in diagnostics."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"  # serving, but some endpoints are down
    UNAVAILABLE = "unavailable"  # cannot serve now (server down, engine dead)
    CLOSED = "closed"


@dataclass(frozen=True)
class EngineHealth:
    """A snapshot for diagnostics and goal admission."""

    state: EngineState
    model: str
    running_requests: int = 0
    detail: str = ""
    # What fails every goal although the engine is up (a server that rejects the API key):
    # the state alone would read "ready" while no goal can succeed.
    problems: tuple[str, ...] = ()


def output_token_limit(max_tokens: int) -> int:
    """Return the most output tokens an engine reads for a request asking for ``max_tokens``.

    Every engine stops there, whatever its backend does: a server that ignores max_tokens
    (a proxy, another implementation, ignore_eos set by mistake) must not make an answer, a
    goal or the start-up unbounded. The margin (8 tokens or 10 %, whichever is more) absorbs
    backends that count a token or two differently (a stop token, a detokenizer flush).
    """
    asked = max(1, int(max_tokens))
    return asked + max(8, -(-asked // 10))


class Engine(abc.ABC):
    """Async inference backend.

    ``stream`` yields ``Chunk``s until one carries a ``finish_reason``; it raises a
    ``CosmosReasonError`` subclass (``EngineUnavailableError``, ``EngineError``,
    ``PromptTooLongError``, ``BadRequestError``, ``DeadlineExceededError``) on failure.
    Closing the async generator early (or cancelling the task consuming it) must abort the
    request in the backend, so that no request is left running.
    """

    @property
    @abc.abstractmethod
    def model_name(self) -> str:
        """The served model's name as reported in results."""

    @property
    def start_failure_is_fatal(self) -> bool:
        """Whether a failed ``start`` should stop the node (True for in-process engines).

        A remote server may come up later: such an engine says False, and the node serves
        goals with ENGINE_UNAVAILABLE until it does.
        """
        return True

    def route_warm_up_as(self, session_key: str) -> None:
        """Send ``start``'s warm-up request with this routing key (the default camera's).

        Behind a router with session affinity it then warms, and counts against, the backend
        this node's requests go to. Engines that are not routed ignore it.
        """
        del session_key

    @abc.abstractmethod
    async def start(self) -> None:
        """Load or connect, then warm up; raise ``EngineUnavailableError`` if impossible."""

    @abc.abstractmethod
    def stream(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        """Generate for one request, streaming chunks."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a running request; unknown or finished ids are ignored."""

    @abc.abstractmethod
    def health(self) -> EngineHealth:
        """Return the current state; never raises.

        Called on the engine's loop (diagnostics) and from a goal's thread (admission) while
        the engine runs: it reads state only, never waits.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Abort everything and release the backend; idempotent."""
