"""py_trees behaviours that ask the cosmos_reason node about what its cameras see.

    import py_trees
    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.planning.behaviours import Ground, Verify

    client = ReasonClient()
    root = py_trees.composites.Selector("patrol", memory=False, children=[
        Verify("aisle clear?", "The aisle ahead is clear.", client=client,
               verdict_key="aisle/verdict", reason_key="aisle/reason"),
        Ground("find obstacle", ["obstacle"], client=client, boxes_key="obstacle/boxes",
               pose_key="obstacle/pose"),
    ])

Each behaviour is one action goal per run: ``initialise`` submits it through
``ReasonClient.submit`` and every ``update`` only looks at the goal's future, so a tick never
blocks (RUNNING while the goal runs, then SUCCESS or FAILURE from its result). They are plain
py_trees behaviours, so they run in a py_trees_ros tree too; the client is given to the
constructor or to ``setup(reason_client=...)``. A behaviour preempted while its goal runs
(``terminate`` with INVALID: a higher-priority branch took over, or the tree stopped) cancels
the goal, and the node aborts its engine request. Each behaviour has its own ``timeout_s``
(the wait for the action server included); past it the goal is cancelled and the behaviour
fails. The same limit goes to the node as the goal's ``timeout_s``, so the engine is freed
even if the tree stops ticking.

Why a behaviour failed is in its ``feedback_message`` (the node's error code and message, the
verdict's reason, the timeout). Results go to the blackboard under the keys the caller names
(absolute, or relative to "/"); a key left empty is not written. Keys are written when a goal
comes back succeeded (also when the behaviour then fails: a "no" verdict, no boxes found); a
goal that fails leaves them as they were, except ``result_key``, which gets every result.

=================  ==================  =============================================================
behaviour          key argument        value written
=================  ==================  =============================================================
every one          ``result_key``      ``ReasonResult``: the whole result (timings, delivery, ...)
``Ask``            ``answer_key``      ``str``: the answer text
``Ground``         ``boxes_key``       ``tuple[ResultBox, ...]``: original-image pixels, each with
                                       its ``camera``
``Point``          ``points_key``      ``tuple[ResultPoint, ...]``: original-image pixels
``Ground``,        ``positions_key``   ``tuple[tuple[float, float, float] | None, ...]``: one per
``Point``                              box or point, metres in ``result.message.frame_3d``; None
                                       where it was not lifted (no depth, no valid pixels)
``Ground``,        ``pose_key``        ``geometry_msgs.msg.PoseStamped | None``: the first lifted
``Point``                              item's position (and its axes where the node gives them,
                                       else the identity), stamped with the image's stamp in
                                       ``frame_3d``; None when none was lifted
``Verify``         ``verdict_key``     ``str``: ``"yes"``, ``"no"`` or ``"unsure"``
``Verify``         ``reason_key``      ``str``: the model's reason (its answer when it gave none)
``Count``          ``count_key``       ``int | None``: the count; None when none could be read
=================  ==================  =============================================================
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import py_trees
from geometry_msgs.msg import PoseStamped
from py_trees.common import Access, Status

from cosmos_reason_interfaces.action import Reason
from cosmos_reason_ros.client import SOURCES, GoalHandle, ReasonClient, ReasonResult
from cosmos_reason_ros.core.parsing import read_count, read_verdict
from cosmos_reason_ros.core.types import ParsedAnswer

DEFAULT_TIMEOUT_S = 30.0


class ReasonBehaviour(py_trees.behaviour.Behaviour):
    """One action goal per run: RUNNING while it runs, SUCCESS/FAILURE from its result.

    Subclasses say which goal to send (``make_goal``) and what its result means
    (``on_result``). Arguments every behaviour takes:

    - ``client``: the ``ReasonClient`` to send through (else ``setup(reason_client=...)``);
    - ``cameras``: the node's camera names to ask about, in order (empty: the default one);
    - ``source``: ``"latest"`` (the newest frame), ``"next"`` (the first frame after the goal
      is accepted) or ``"clip"``; ``max_image_age_s`` / ``wait_for_image_s`` as the goal's;
    - ``timeout_s``: this behaviour's limit for one goal, the wait for the server included;
    - ``response_schema``: a JSON schema (text or a dict) the answer must follow;
    - ``result_key``: where to write the whole ``ReasonResult``;
    - ``clock``: seconds, monotonic (tests pass a fake one);
    - ``goal_fields``: any other ``Reason.Goal`` field (``reasoning=True``, ``max_tokens``).
    """

    def __init__(self, name: str, *, client: ReasonClient | None = None,
                 cameras: Sequence[str] = (), source: str = "latest",
                 timeout_s: float = DEFAULT_TIMEOUT_S, response_schema: str | dict = "",
                 max_image_age_s: float = 0.0, wait_for_image_s: float = 0.0,
                 result_key: str = "", clock: Callable[[], float] = time.monotonic,
                 **goal_fields: Any) -> None:
        """Check the arguments now, so a tree with a bad one fails when it is built."""
        super().__init__(name)
        if isinstance(cameras, str):
            raise TypeError(f"{name}: cameras={cameras!r}: give a list of camera names, e.g. "
                            f"{cameras.split(',')!r}, not one string")
        if source not in SOURCES:
            raise ValueError(f"{name}: source={source!r}: expected one of {sorted(SOURCES)}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
                and timeout_s > 0):
            raise ValueError(f"{name}: timeout_s={timeout_s!r}: expected seconds > 0")
        if isinstance(response_schema, dict):
            response_schema = json.dumps(response_schema)
        self.client = client
        self.cameras = tuple(cameras)
        self.timeout_s = float(timeout_s)
        self.clock = clock
        self.goal_fields: dict[str, Any] = {
            "source": SOURCES[source], "response_schema": response_schema,
            "max_image_age_s": float(max_image_age_s),
            "wait_for_image_s": float(wait_for_image_s),
            # The node ends the goal at the same limit: the engine is freed even if the tree
            # stops ticking and never preempts it.
            "timeout_s": self.timeout_s, **goal_fields}
        # An unknown goal field (AttributeError) or a value of the wrong type fails here, when
        # the tree is built, not at its first tick.
        ReasonClient.goal("", "", (), self.cameras, **self.goal_fields)
        self.result: ReasonResult | None = None  # the last run's result
        self._handle: GoalHandle | None = None
        self._deadline = 0.0
        self._keys: dict[str, str] = {}
        self._board = self.attach_blackboard_client(name=name)
        self._key("result", result_key)

    def _key(self, role: str, key: str) -> None:
        """Register ``key`` (may be empty: not written) as where ``role`` goes."""
        if key:
            self._board.register_key(key, access=Access.WRITE)
            self._keys[role] = key

    def _write(self, role: str, value: Any) -> None:
        key = self._keys.get(role)
        if key:
            self._board.set(key, value, overwrite=True)

    def setup(self, **kwargs: Any) -> None:
        """Take the client from ``reason_client=`` when the constructor was given none."""
        if self.client is None:
            self.client = kwargs.get("reason_client")
        if self.client is None:
            raise ValueError(f"{self.name}: no ReasonClient: pass client= to the behaviour or "
                             "reason_client= to the tree's setup()")

    def make_goal(self) -> Reason.Goal:
        """Return the goal to send (subclasses)."""
        raise NotImplementedError

    def on_result(self, result: ReasonResult) -> Status:
        """Write the keys of a succeeded result and say what it means (subclasses)."""
        raise NotImplementedError

    def initialise(self) -> None:
        """Submit the goal; never waits (the client's spin thread sends it)."""
        if self.client is None:
            self.setup()  # raises, naming what is missing
        assert self.client is not None
        self.result = None
        self._deadline = self.clock() + self.timeout_s
        self._handle = self.client.submit(self.make_goal(), server_timeout_s=self.timeout_s)
        self.feedback_message = "goal submitted"

    def update(self) -> Status:
        """Look at the goal's future: RUNNING until it is done or the time is up."""
        handle = self._handle
        if handle is None:
            return Status.FAILURE  # not initialised: py_trees always initialises first
        if not handle.future.done():
            if self.clock() < self._deadline:
                self.feedback_message = "goal running" if handle.sent \
                    else "waiting for the action server"
                return Status.RUNNING
            self._cancel()
            self.feedback_message = (f"timed out after {self.timeout_s:g} s (timeout_s); "
                                     "the goal was cancelled")
            return Status.FAILURE
        self._handle = None
        try:
            result = handle.future.result()
        except Exception as e:  # noqa: BLE001 - server not found, client closed: the reason
            self.feedback_message = f"no result: {type(e).__name__}: {e}"
            return Status.FAILURE
        self.result = result
        self._write("result", result)
        if not result.ok:
            self.feedback_message = (f"goal {result.status}: {result.error_code.name}: "
                                     f"{result.error_message}")
            return Status.FAILURE
        return self.on_result(result)

    def terminate(self, new_status: Status) -> None:
        """Cancel the goal if it still runs (preempted, or the tree stopped)."""
        if self._handle is not None and not self._handle.future.done():
            self._cancel()
            self.feedback_message = f"preempted ({new_status.value}): the goal was cancelled"
        self._handle = None

    def _cancel(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()  # queued to the client's spin thread: does not block the tick

    def goal(self, prompt: str = "", task: str = "", targets: Sequence[str] = ()) -> Reason.Goal:
        """Build this behaviour's goal with its cameras, source and other fields."""
        return ReasonClient.goal(prompt, task, targets, self.cameras, **self.goal_fields)


class Ask(ReasonBehaviour):
    """Ask a free-form question; SUCCESS with the answer (``answer_key``: str)."""

    def __init__(self, name: str, prompt: str, *, answer_key: str = "",
                 reasoning: bool = False, **kwargs: Any) -> None:
        """``prompt``: the question; ``reasoning``: have the model reason first."""
        super().__init__(name, reasoning=reasoning, **kwargs)
        self.prompt = prompt
        self._key("answer", answer_key)

    def make_goal(self) -> Reason.Goal:
        """Return a vqa goal."""
        return self.goal(self.prompt, "vqa")

    def on_result(self, result: ReasonResult) -> Status:
        """SUCCESS with the answer; FAILURE when it is empty."""
        self._write("answer", result.answer)
        self.feedback_message = result.answer[:200]
        return Status.SUCCESS if result.answer.strip() else Status.FAILURE


def positions_of(items: Sequence[Any]) -> tuple[tuple[float, float, float] | None, ...]:
    """Return each box's or point's 3D position (metres), or None where it was not lifted."""
    out: list[tuple[float, float, float] | None] = []
    for item in items:
        p3 = getattr(item, "position_3d", None)
        if p3 is not None and p3.valid:
            out.append((float(p3.position.x), float(p3.position.y), float(p3.position.z)))
        else:
            out.append(None)
    return tuple(out)


def pose_of(result: ReasonResult, items: Sequence[Any]) -> PoseStamped | None:
    """Return the first lifted item's pose in the result's 3D frame, at the image's stamp.

    The orientation is the item's axes (``Position3D.orientation``) where the interface has
    them, else the identity: the node gives a position and an extent, not a heading.
    """
    for item, position in zip(items, positions_of(items), strict=True):
        if position is None:
            continue
        pose = PoseStamped()
        pose.header.frame_id = result.message.frame_3d
        pose.header.stamp = result.message.header.stamp
        pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = position
        q = getattr(item.position_3d, "orientation", None)
        if q is not None and (q.x, q.y, q.z, q.w) != (0.0, 0.0, 0.0, 0.0):
            pose.pose.orientation = q
        else:
            pose.pose.orientation.w = 1.0
        return pose
    return None


class _Locate(ReasonBehaviour):
    """Ground or Point: items in pixels, their 3D positions and the first one's pose."""

    task = ""
    what = ""

    def __init__(self, name: str, targets: Sequence[str], *, positions_key: str = "",
                 pose_key: str = "", min_found: int = 1, **kwargs: Any) -> None:
        """``targets``: what to find; SUCCESS when at least ``min_found`` items came back."""
        if isinstance(targets, str):
            targets = [targets]
        if not targets:
            raise ValueError(f"{name}: targets=[]: name at least one thing to find")
        super().__init__(name, **kwargs)
        self.targets = tuple(targets)
        self.min_found = int(min_found)
        self._key("positions", positions_key)
        self._key("pose", pose_key)

    def make_goal(self) -> Reason.Goal:
        """Return a ground or point goal for the targets."""
        return self.goal("", self.task, self.targets)

    def items(self, result: ReasonResult) -> tuple[Any, ...]:
        """Return the result's boxes or points."""
        raise NotImplementedError

    def on_result(self, result: ReasonResult) -> Status:
        """Write the items, positions and pose; SUCCESS when enough were found."""
        items = self.items(result)
        self._write(self.what, items)
        self._write("positions", positions_of(items))
        self._write("pose", pose_of(result, items))
        lifted = sum(p is not None for p in positions_of(items))
        self.feedback_message = (f"{len(items)} {self.what} of {list(self.targets)} "
                                 f"({lifted} lifted to 3D)")
        return Status.SUCCESS if len(items) >= self.min_found else Status.FAILURE


class Ground(_Locate):
    """Find boxes of ``targets`` (``boxes_key``: original-image pixels, ``ResultBox``)."""

    task = "ground"
    what = "boxes"

    def __init__(self, name: str, targets: Sequence[str], *, boxes_key: str = "",
                 **kwargs: Any) -> None:
        """See ``_Locate``; ``boxes_key`` gets the boxes."""
        super().__init__(name, targets, **kwargs)
        self._key("boxes", boxes_key)

    def items(self, result: ReasonResult) -> tuple[Any, ...]:
        """Return the boxes."""
        return result.boxes


class Point(_Locate):
    """Point at ``targets`` (``points_key``: original-image pixels, ``ResultPoint``)."""

    task = "point"
    what = "points"

    def __init__(self, name: str, targets: Sequence[str], *, points_key: str = "",
                 **kwargs: Any) -> None:
        """See ``_Locate``; ``points_key`` gets the points."""
        super().__init__(name, targets, **kwargs)
        self._key("points", points_key)

    def items(self, result: ReasonResult) -> tuple[Any, ...]:
        """Return the points."""
        return result.points


class Verify(ReasonBehaviour):
    """Check a statement: yes → SUCCESS; no, unsure → FAILURE with the reason."""

    def __init__(self, name: str, statement: str, *, verdict_key: str = "",
                 reason_key: str = "", **kwargs: Any) -> None:
        """``statement``: what must hold, e.g. "The aisle ahead is clear."."""
        super().__init__(name, **kwargs)
        self.statement = statement
        self._key("verdict", verdict_key)
        self._key("reason", reason_key)

    def make_goal(self) -> Reason.Goal:
        """Return a verify goal."""
        return self.goal(self.statement, "verify")

    def on_result(self, result: ReasonResult) -> Status:
        """Read the verdict the way the node's parser does (JSON first, then the text)."""
        verdict = read_verdict(ParsedAnswer(raw_text=result.answer, reasoning="",
                                            answer=result.answer,
                                            answer_json=result.answer_json or None))
        word = {True: "yes", False: "no", None: "unsure"}[verdict]
        reason = _reason(result)
        self._write("verdict", word)
        self._write("reason", reason)
        self.feedback_message = f"{word}: {reason}"[:300]
        return Status.SUCCESS if verdict is True else Status.FAILURE


def _reason(result: ReasonResult) -> str:
    """Return the verdict's ``reason`` from the answer JSON, else the answer text."""
    try:
        value = json.loads(result.answer_json) if result.answer_json else None
    except ValueError:
        value = None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict) and isinstance(value.get("reason"), str):
        return value["reason"]
    return result.answer


class Count(ReasonBehaviour):
    """Count ``targets`` together; SUCCESS when the count is within [min_count, max_count]."""

    def __init__(self, name: str, targets: Sequence[str], *, count_key: str = "",
                 min_count: int = 0, max_count: int | None = None, **kwargs: Any) -> None:
        """``count_key`` gets the count (None when unreadable, which fails)."""
        if isinstance(targets, str):
            targets = [targets]
        if not targets:
            raise ValueError(f"{name}: targets=[]: name at least one thing to count")
        super().__init__(name, **kwargs)
        self.targets = tuple(targets)
        self.min_count, self.max_count = int(min_count), max_count
        self._key("count", count_key)

    def make_goal(self) -> Reason.Goal:
        """Return a count goal."""
        return self.goal("", "count", self.targets)

    def on_result(self, result: ReasonResult) -> Status:
        """Write the count; FAILURE when unreadable or out of bounds."""
        count = read_count(ParsedAnswer(raw_text=result.answer, reasoning="",
                                        answer=result.answer,
                                        answer_json=result.answer_json or None))
        self._write("count", count)
        if count is None:
            self.feedback_message = f"no count in the answer: {result.answer[:200]!r}"
            return Status.FAILURE
        self.feedback_message = f"{count} {list(self.targets)}"
        if count < self.min_count or (self.max_count is not None and count > self.max_count):
            self.feedback_message += (f", expected {self.min_count}.."
                                      f"{'' if self.max_count is None else self.max_count}")
            return Status.FAILURE
        return Status.SUCCESS


class WaitUntilSeen(py_trees.decorators.Decorator):
    """Run ``child`` (e.g. a ``Ground`` or ``Verify``) again until it succeeds, or time is up.

    RUNNING while the child runs and between attempts; SUCCESS when an attempt succeeds;
    FAILURE once ``timeout_s`` has passed (a running attempt is cancelled). ``period_s``
    spaces the attempts' starts, so a camera that shows nothing is not asked back to back.
    """

    def __init__(self, name: str, child: py_trees.behaviour.Behaviour, *,
                 timeout_s: float = 60.0, period_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: seconds, monotonic (tests pass a fake one)."""
        super().__init__(name=name, child=child)  # keywords: py_trees 2.1 had (child, name)
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"{name}: timeout_s={timeout_s!r}: expected seconds > 0")
        if not (math.isfinite(period_s) and period_s >= 0):
            raise ValueError(f"{name}: period_s={period_s!r}: expected seconds >= 0")
        self.timeout_s, self.period_s, self.clock = float(timeout_s), float(period_s), clock
        self.attempts = 0
        self._deadline = 0.0
        self._next_start = 0.0

    def initialise(self) -> None:
        """Start the wait: the first attempt goes at once."""
        now = self.clock()
        self.attempts = 0
        self._deadline = now + self.timeout_s
        self._next_start = now

    def tick(self) -> Any:
        """Tick the child unless it is between attempts or the time is up."""
        if self.status != Status.RUNNING:
            self.initialise()
        now = self.clock()
        child = self.decorated
        starting = child.status != Status.RUNNING
        if now < self._deadline and (not starting or now >= self._next_start):
            if starting:
                self.attempts += 1
                self._next_start = now + self.period_s
            yield from child.tick()
        new_status = self.update()
        if new_status != Status.RUNNING:
            self.stop(new_status)  # stops a running child (cancelling its goal)
        self.status = new_status
        yield self

    def update(self) -> Status:
        """SUCCESS when the child succeeded; FAILURE when the time is up; else RUNNING."""
        child = self.decorated
        if child.status == Status.SUCCESS:
            self.feedback_message = f"seen after {self.attempts} attempt(s): " \
                                    f"{child.feedback_message}"
            return Status.SUCCESS
        if self.clock() >= self._deadline:
            self.feedback_message = (f"not seen within {self.timeout_s:g} s (timeout_s, "
                                     f"{self.attempts} attempt(s)); last: "
                                     f"{child.feedback_message}")
            return Status.FAILURE
        self.feedback_message = f"attempt {self.attempts}: {child.feedback_message}"
        return Status.RUNNING
