"""The action server has a node, single-threaded executor and thread of its own; goals run apart.

What would fail if the action server were spun again by the main node's (multi-threaded)
executor, if a goal held the action executor's one thread for its run, or if a goal worker's
completion did not wake that executor (rclpy resumes a task awaiting a future only on an
executor pass: ``ros/action_host.py``). No timing is asserted: each wait is for an event, with
a bound far above what it takes.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (make setup)")
from action_msgs.msg import GoalStatus  # noqa: E402
from fake_engine import Script  # noqa: E402
from inprocess_node import InProcessNode  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from cosmos_reason_ros.core.types import ErrorCode  # noqa: E402
from cosmos_reason_ros.ros.action_host import ActionHost, GoalWorkers  # noqa: E402

pytestmark = [pytest.mark.ros]


@pytest.fixture
def bare_host():
    context = Context()
    rclpy.init(context=context)
    main = rclpy.create_node("host_test", namespace="/robot", context=context)
    host = ActionHost(main, workers=2)
    host.start()
    yield host
    host.close()
    main.destroy_node()
    rclpy.try_shutdown(context=context)


def test_a_worker_completion_wakes_the_idle_action_executor(bare_host):
    # Nothing else is in the host's wait set: without the wake, the executor would block in
    # its wait forever after the coroutine yielded on the pending future.
    host = bare_host
    awaiting, gate, finished = threading.Event(), threading.Event(), threading.Event()
    got: list = []

    def work() -> str:
        assert gate.wait(10.0)
        return threading.current_thread().name

    async def callback() -> None:
        future = host.run(work)
        awaiting.set()
        got.append(await future)
        got.append(threading.current_thread().name)
        finished.set()

    host.executor.create_task(callback)
    assert awaiting.wait(10.0)
    gate.set()
    assert finished.wait(10.0), "the completed future did not resume the awaiting task"
    assert got == ["goal-0", "actions"]


def test_a_failing_job_hands_its_exception_to_the_awaiting_task(bare_host):
    host = bare_host
    finished = threading.Event()
    got: list = []

    def work() -> None:
        raise ValueError("bad goal")

    async def callback() -> None:
        try:
            await host.run(work)
        except ValueError as e:
            got.append(str(e))
        finished.set()

    host.executor.create_task(callback)
    assert finished.wait(10.0)
    assert got == ["bad goal"]


def test_the_host_node_takes_the_main_nodes_name_and_namespace(bare_host):
    assert bare_host.node.get_fully_qualified_name() == "/robot/host_test_actions"
    assert type(bare_host.executor) is SingleThreadedExecutor
    assert bare_host.thread is not None and bare_host.thread.name == "actions"


def test_goal_workers_start_threads_only_as_jobs_need_them():
    woken = threading.Semaphore(0)
    workers = GoalWorkers(3, woken.release)
    gate = threading.Event()
    futures = [workers.run(gate.wait) for _ in range(2)]
    assert workers.threads == 2
    gate.set()
    for _ in futures:
        assert woken.acquire(timeout=10.0)
    assert all(f.done() and f.result() is True for f in futures)
    workers.run(lambda: None)  # a worker is free again: no third thread
    assert woken.acquire(timeout=10.0)
    assert workers.threads == 2
    workers.stop()


def test_goals_run_on_the_action_hosts_executor_many_more_than_its_threads():
    goals = 8
    n = InProcessNode({"limits.max_concurrent_goals": goals, "limits.max_queued_goals": 0},
                      script=lambda r: Script(deltas=["x "], delay_s=0.01, endless=True))
    try:
        node, host = n.node, n.node.action_host
        assert host is not None
        # The action server belongs to the host node, which only the host's executor spins.
        server = node._action_server
        assert server in host.node.waitables and server not in node.waitables
        assert host.node.get_fully_qualified_name() == "/cosmos_reason_actions"
        assert type(host.executor) is SingleThreadedExecutor
        assert host.node in host.executor.get_nodes()
        assert host.node not in n.executor.get_nodes()
        assert host.thread is not None and host.thread.is_alive()
        # Every goal generates at once: more goals than the action executor (1 thread) and the
        # main executor have threads, so none of them holds an executor thread while it runs.
        assert goals > node.executor_threads() + 1
        n.publish()
        n.wait_frames(1)
        handles = [n.send(prompt=f"goal {i}") for i in range(goals)]
        assert all(h.accepted for h in handles)
        deadline = time.monotonic() + 30
        while len(n.engine.running) < goals:
            assert time.monotonic() < deadline, f"{len(n.engine.running)} of {goals} running"
            time.sleep(0.01)
        names = {t.name for t in threading.enumerate()}
        assert {f"goal-{i}" for i in range(goals)} <= names
        for handle in handles:
            handle.cancel_goal_async()
        for handle in handles:
            status, result = n.result(handle)
            assert status == GoalStatus.STATUS_CANCELED
            assert result.error_code == ErrorCode.CANCELLED
    finally:
        n.close()
    assert node.action_host is None
    assert not host.thread.is_alive()
