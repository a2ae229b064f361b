"""Thread-safe history of raw frames: latest frame, wait for the next one, clips at N fps.

The ROS image callback stores the message object itself (``FrameHistory.append`` is O(1): a
deque append, a running byte count and a condition notify) and nothing is decoded on receipt;
goals convert the one or few frames they use, on their own thread.

Time comes from the caller so that the history works with ROS sim time: ``stamp_ns`` is the
message header stamp, and receipt times come from the ``clock`` given to the constructor (in
the node, ``lambda: node.get_clock().now().nanoseconds``). Timeouts of blocking calls are wall
clock seconds.

Stamps going backwards: a stamp more than ``reset_backwards_s`` older than the previous one
(a rosbag looping, sim time restarting) clears the history before the new frame is stored, so
clips never mix two timelines. Smaller reorderings (several publishers, best-effort delivery)
are kept; time queries sort by stamp.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from cosmos_reason_ros.core.types import ImageTooOldError, NoImageError

T = TypeVar("T")

_NS = 1_000_000_000


@dataclass(frozen=True)
class StoredFrame(Generic[T]):
    """One stored frame: the raw payload (e.g. a ROS message) and when it was taken / received.

    ``seq`` counts appends from 1 and identifies a frame uniquely within one history.
    """

    stamp_ns: int
    received_ns: int
    payload: T
    nbytes: int
    seq: int


@dataclass(frozen=True)
class FrameHistoryStats:
    """Counters of a :class:`FrameHistory`, for diagnostics."""

    received: int  # frames appended since construction
    evicted: int  # frames dropped to honour max_frames / max_bytes
    resets: int  # times the history was cleared because stamps jumped backwards
    cleared: int  # frames dropped by those resets and by clear()
    frames: int  # frames held now
    bytes: int  # payload bytes held now (sum of nbytes)


class FrameHistory(Generic[T]):
    """A bounded, time-indexed history of raw frames, safe to use from several threads.

    Bounded by ``max_frames`` and ``max_bytes`` (the oldest frames are evicted first; the
    newest frame is always kept even if it alone exceeds ``max_bytes``).
    """

    def __init__(
        self,
        max_frames: int = 64,
        max_bytes: int = 512 * 1024 * 1024,
        *,
        clock: Callable[[], int] = time.time_ns,
        reset_backwards_s: float = 1.0,
    ) -> None:
        """Create an empty history.

        ``clock`` returns "now" in integer nanoseconds (the ROS clock in the node; wall time by
        default). ``reset_backwards_s`` is how far a stamp may go back before the history is
        cleared.
        """
        if max_frames < 1:
            raise ValueError(f"max_frames={max_frames}; expected >= 1")
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes}; expected >= 0")
        if reset_backwards_s < 0:
            raise ValueError(f"reset_backwards_s={reset_backwards_s}; expected >= 0")
        self.max_frames = int(max_frames)
        self.max_bytes = int(max_bytes)
        self._clock = clock
        self._reset_backwards_ns = int(reset_backwards_s * _NS)
        self._frames: collections.deque[StoredFrame[T]] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._bytes = 0
        self._seq = 0
        self._last_stamp_ns: int | None = None
        self._evicted = 0
        self._resets = 0
        self._cleared = 0
        self._closed = False

    # --- writing ------------------------------------------------------------------------------

    def append(
        self, payload: T, stamp_ns: int, *, nbytes: int, received_ns: int | None = None
    ) -> StoredFrame[T]:
        """Store a reference to ``payload``; O(1) amortized, never converts or copies it.

        ``nbytes`` is the payload's size for the byte bound (``len(msg.data)``);
        ``received_ns`` defaults to the history's clock.
        """
        if received_ns is None:
            received_ns = self._clock()
        with self._cond:
            last = self._last_stamp_ns
            if last is not None and stamp_ns < last - self._reset_backwards_ns:
                self._resets += 1
                self._clear_locked()
            self._seq += 1
            frame = StoredFrame(int(stamp_ns), int(received_ns), payload, int(nbytes), self._seq)
            self._frames.append(frame)
            self._bytes += frame.nbytes
            self._last_stamp_ns = frame.stamp_ns
            frames = self._frames
            while len(frames) > 1 and (
                len(frames) > self.max_frames or self._bytes > self.max_bytes
            ):
                self._bytes -= frames.popleft().nbytes
                self._evicted += 1
            self._cond.notify_all()
        return frame

    def clear(self) -> None:
        """Drop every stored frame (counters other than ``frames``/``bytes`` are kept)."""
        with self._cond:
            self._clear_locked()
            self._last_stamp_ns = None

    def _clear_locked(self) -> None:
        self._cleared += len(self._frames)
        self._frames.clear()
        self._bytes = 0

    def close(self) -> None:
        """Wake every waiter; later :meth:`wait_for_next` calls return ``None`` at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`: waiting on this history would return at once."""
        with self._cond:
            return self._closed

    # --- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Return the number of frames held."""
        with self._cond:
            return len(self._frames)

    def stats(self) -> FrameHistoryStats:
        """Return a consistent snapshot of the counters."""
        with self._cond:
            return FrameHistoryStats(
                received=self._seq,
                evicted=self._evicted,
                resets=self._resets,
                cleared=self._cleared,
                frames=len(self._frames),
                bytes=self._bytes,
            )

    def snapshot(self) -> list[StoredFrame[T]]:
        """Return the stored frames in receipt order (a copy of the list, not of payloads)."""
        with self._cond:
            return list(self._frames)

    def latest(self) -> StoredFrame[T] | None:
        """Return the most recently received frame, or ``None`` if there is none."""
        with self._cond:
            return self._frames[-1] if self._frames else None

    def require_latest(
        self, max_age_s: float | None = None, now_ns: int | None = None
    ) -> StoredFrame[T]:
        """Return the latest frame, raising NoImageError / ImageTooOldError when unusable.

        The age is ``now_ns - stamp_ns`` (``now_ns`` defaults to the clock); ``max_age_s``
        ``None`` or <= 0 accepts any age.
        """
        frame = self.latest()
        if frame is None:
            raise NoImageError("no image received yet")
        if max_age_s is not None and max_age_s > 0:
            now = self._clock() if now_ns is None else now_ns
            age_s = (now - frame.stamp_ns) / _NS
            if age_s > max_age_s:
                raise ImageTooOldError(
                    f"latest image is {age_s:.3f} s old (stamp_ns={frame.stamp_ns}); "
                    f"max_age_s={max_age_s}"
                )
        return frame

    def wait_for_next(
        self, after_ns: int | None = None, timeout_s: float | None = None
    ) -> StoredFrame[T] | None:
        """Block until a frame received after ``after_ns`` exists; return it or ``None``.

        Returns the first (in receipt order) frame taken after ``after_ns``: its header stamp
        when that is on the same clock as its receipt time (within 2 s), else its receipt
        time; with
        ``after_ns=None``, the first frame appended after this call. Frames stored after a
        stamp reset also qualify (the clock went back, so comparing with ``after_ns`` means
        nothing). Returns ``None`` on timeout (wall clock seconds) or after :meth:`close`.
        """
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            start_seq = self._seq
            start_resets = self._resets
            while True:
                if self._closed:
                    return None
                found = self._find_next_locked(after_ns, start_seq, start_resets)
                if found is not None:
                    return found
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self._cond.wait(remaining)

    def _find_next_locked(
        self, after_ns: int | None, start_seq: int, start_resets: int
    ) -> StoredFrame[T] | None:
        reset_since = self._resets != start_resets
        # Frames are in receipt order; new ones are at the right, so scan from the newest
        # backwards and keep the earliest match.
        match = None
        for frame in reversed(self._frames):
            if after_ns is None or reset_since:
                ok = frame.seq > start_seq
            else:
                ok = capture_ns(frame) > after_ns
            if ok:
                match = frame
            elif after_ns is None or reset_since:
                break  # seqs only decrease from here
        return match

    def frames_since(self, since_ns: int, until_ns: int | None = None) -> list[StoredFrame[T]]:
        """Return the frames with ``since_ns <= stamp_ns <= until_ns``, sorted by stamp."""
        with self._cond:
            frames = list(self._frames)
        return sorted(
            (
                f
                for f in frames
                if f.stamp_ns >= since_ns and (until_ns is None or f.stamp_ns <= until_ns)
            ),
            key=lambda f: (f.stamp_ns, f.seq),
        )

    def clip(
        self,
        duration_s: float,
        fps: float,
        max_frames: int | None = None,
        now_ns: int | None = None,
    ) -> list[StoredFrame[T]]:
        """Sample the last ``duration_s`` at ``fps``: distinct frames sorted by stamp.

        The window ends at ``now_ns`` (default: the newest stamp, so the newest frame is always
        in the clip). Sample times are ``end - k / fps`` for ``k = 0 .. n-1`` with
        ``n = round(duration_s * fps)``; each takes the frame whose stamp is nearest, if one lies
        within half a sample period, so gaps yield fewer frames rather than duplicates. When
        ``n > max_frames`` the ``max_frames`` samples are spread over the whole duration
        instead (a lower effective fps). Returns ``[]`` when nothing fits.
        """
        if duration_s <= 0 or fps <= 0:
            raise ValueError(f"duration_s={duration_s}, fps={fps}; expected both > 0")
        with self._cond:
            frames = list(self._frames)
        if not frames:
            return []
        frames.sort(key=lambda f: (f.stamp_ns, f.seq))
        stamps = [f.stamp_ns for f in frames]
        end_ns = stamps[-1] if now_ns is None else int(now_ns)
        count = max(1, int(round(duration_s * fps)))
        period_ns = _NS / fps
        if max_frames is not None and count > max_frames:
            if max_frames < 1:
                return []
            count = int(max_frames)
            period_ns = duration_s * _NS / count
        tolerance_ns = period_ns / 2
        chosen: dict[int, StoredFrame[T]] = {}
        for k in range(count):
            t = end_ns - k * period_ns
            i = bisect.bisect_left(stamps, t)
            best = None
            best_d = tolerance_ns
            # Ties go to the later frame (i), which is checked first.
            for j in (i, i - 1):
                if 0 <= j < len(frames):
                    d = abs(stamps[j] - t)
                    if d < best_d or (best is None and d <= best_d):
                        best, best_d = frames[j], d
            if best is not None:
                chosen[best.seq] = best
        return sorted(chosen.values(), key=lambda f: (f.stamp_ns, f.seq))


# Header stamps within this of the receipt time are taken to be on the same clock.
_SAME_CLOCK_NS = 2 * _NS


def capture_ns(frame: StoredFrame[T]) -> int:
    """When the frame was taken, on the history's clock, as well as it can be told.

    The header stamp when it is on the same clock as the receipt time (camera drivers stamp
    with the ROS clock; under sim time both follow /clock): a frame captured before a goal
    but delivered after it is then not "next". Otherwise (a camera's own clock, a zero
    stamp) the receipt time.
    """
    if abs(frame.received_ns - frame.stamp_ns) <= _SAME_CLOCK_NS:
        return frame.stamp_ns
    return frame.received_ns
