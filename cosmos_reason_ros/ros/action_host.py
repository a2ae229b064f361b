"""Where ``~/reason`` goals are served: a node, executor and thread of their own, plus workers.

rclpy runs an action server's callbacks on the executor of the node that owns it. On the main
node's multi-threaded executor each goal held an executor thread for its whole run, and every
pass of that executor also waited on the parameter services and timers. rclpy's action costs
~2 ms more per goal on a ``MultiThreadedExecutor`` than on a ``SingleThreadedExecutor`` (16
cores), and more with every entity in the wait set (docs/PERFORMANCE.md, "The floor under the
action transport"). So the action server lives on ``<name>_actions``, a node in the same
context (same DDS participant) spun by a ``SingleThreadedExecutor`` on the "actions" thread,
and its execute callback is a coroutine: it hands the goal's work to ``GoalWorkers`` (one
thread per running or queued goal) and awaits an rclpy ``Future`` they complete.

rclpy from Humble to Kilted resumes a task awaiting a ``Future`` only on an executor pass
(``Future.__await__`` yields while pending; ``Executor._wait_for_ready_callbacks`` resumes the
pending tasks, then blocks in the wait set). A future completed from another thread wakes
nothing by itself, so a worker calls ``Executor.wake()`` (it triggers the executor's guard
condition; Humble has it, unchanged to Kilted) after setting the result.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.task import Future


class _Job(NamedTuple):
    work: Callable[[], Any]
    future: Future


class GoalWorkers:
    """At most ``size`` daemon threads ("goal-N") running goal bodies, started when needed.

    ``run(work)`` returns a ``Future`` that a worker completes with ``work()``'s return value
    (or its exception), then calls ``wake`` so that the executor whose task awaits the future
    takes it on its next pass. The node admits at most ``size`` goals, so a goal never waits
    for a worker but for the moment a worker takes between one goal's end and the next.
    Daemon threads: a goal stuck in the engine never holds the process at exit.
    """

    def __init__(self, size: int, wake: Callable[[], None], name: str = "goal") -> None:
        """Allow ``size`` threads; ``wake()`` after each completion."""
        if size < 1:
            raise ValueError(f"size={size}: expected >= 1")
        self.size = size
        self._wake = wake
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._unfinished = 0  # jobs given and not yet completed
        self._stopped = False

    @property
    def threads(self) -> int:
        """Worker threads started so far."""
        with self._lock:
            return len(self._threads)

    def run(self, work: Callable[[], Any]) -> Future:
        """Run ``work()`` on a worker; return the future of its result (awaitable in rclpy)."""
        future = Future()
        with self._lock:
            if self._stopped:
                raise RuntimeError("goal workers stopped")
            self._jobs.put(_Job(work, future))
            self._unfinished += 1
            if self._unfinished > len(self._threads) and len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, future = job
            try:
                future.set_result(work())
            except Exception as e:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(e)
            with self._lock:
                self._unfinished -= 1
            self._wake()

    def stop(self, timeout_s: float = 2.0) -> None:
        """End every worker once its job is done (bounded wait; they are daemon threads)."""
        with self._lock:
            self._stopped = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join(timeout_s / max(1, len(threads)))


class ActionHost:
    """``<name>_actions``: the node, single-threaded executor and thread of an action server.

    The node is created in the main node's context with the main node's namespace and ignores
    process-wide arguments (a launch-file rename must not rename it into a clash with the main
    node): give it names the main node resolved (``node.resolve_topic_name("~/reason")``), so
    remaps and namespaces apply as they would on the main node. Create the action server on
    ``node``, then ``start()``.
    """

    def __init__(self, main: Node, workers: int) -> None:
        """Build the node and executor for ``main``; ``workers`` threads at most for goals."""
        self.node = rclpy.create_node(
            f"{main.get_name()}_actions", namespace=main.get_namespace(), context=main.context,
            use_global_arguments=False, start_parameter_services=False)
        self.executor = SingleThreadedExecutor(context=main.context)
        self.executor.add_node(self.node)
        self.workers = GoalWorkers(workers, self.wake)
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Spin the executor on the "actions" thread."""
        self.thread = threading.Thread(target=self._spin, name="actions", daemon=True)
        self.thread.start()

    def run(self, work: Callable[[], Any]) -> Future:
        """Run ``work()`` on a goal worker; await the returned future in an action callback."""
        return self.workers.run(work)

    def wake(self) -> None:
        """Make the executor take another pass (from any thread)."""
        try:
            self.executor.wake()
        except (InvalidHandle, AttributeError):
            # The executor was shut down between wake's check of its guard condition and the
            # trigger (a goal stuck past the shutdown bounds): nobody waits for this pass.
            pass

    def _spin(self) -> None:
        while not self._stop.is_set():
            try:
                self.executor.spin_once()
            except ExternalShutdownException:
                return  # the context was shut down
            except Exception as e:  # noqa: BLE001 - the thread must keep serving goals
                if not self.node.context.ok():
                    return
                self.node.get_logger().error(f"action executor: {e!r}")

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (bounded), the executor and the workers; destroy the node.

        The thread leaves its wait first, then the executor is shut down: shutting an
        executor down under a thread inside rcl's wait frees its guard condition under it,
        and a thread still in that wait at interpreter exit aborts the process
        (ros2/rclpy#1484).
        """
        self._stop.set()
        self.wake()
        if self.thread is not None:
            self.thread.join(timeout_s)
        self.executor.shutdown(timeout_sec=1.0)
        self.workers.stop(timeout_s)
        self.node.destroy_node()
