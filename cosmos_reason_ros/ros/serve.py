"""The node's process: start-up, the spin loop, signals and an orderly shutdown.

``ros2 run cosmos_reason_ros cosmos_reason_node`` and ``python -m cosmos_reason_ros.ros.node``
end up here (``node.main``). What a signal does at each moment, and why no child process
outlives the node: docs/RELIABILITY.md, "Shutdown and signals".
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from cosmos_reason_ros import dds
from cosmos_reason_ros.config import ConfigError
from cosmos_reason_ros.core.types import CosmosReasonError
from cosmos_reason_ros.engines.base import Engine
from cosmos_reason_ros.ros import process_life, pylog
from cosmos_reason_ros.ros.node import NODE_NAME, ReasonNode


def serve(args: list[str] | None = None, engine: Engine | None = None) -> NoReturn:
    """Run the node until SIGINT/SIGTERM; exit 2 on a configuration error, 1 on engine failure.

    A stop signal while the engine starts (``lifecycle.autostart``, or an activate a lifecycle
    manager asked for) ends the start at once (its processes are killed) and exits 0 with one
    log line. Once serving, every accepted goal ends with an aborted result before the action
    server goes (``ReasonNode.release``). No process started by the node outlives it, however
    it ends (``process_life``). ``engine`` replaces the configured one (tests).
    """
    dds_profile = dds.use_profile()  # before the first participant
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    signals = process_life.StopSignals()
    process_life.stop_with_launcher()  # after StopSignals: its SIGTERM is a stop like any
    process_life.own_spawned_processes()
    logger = rclpy.logging.get_logger(NODE_NAME)  # until the node exists
    node: ReasonNode | None = None
    executor: MultiThreadedExecutor | None = None
    code = 0
    try:
        try:
            node = ReasonNode(engine)
            # The process's lines are the node's: its name under any namespace or remap.
            logger = node.get_logger()
            logger.info(dds_profile)
            pylog.match_vllm_logging(logger)
            node.start()  # autostart: configure and activate here, in the main thread
        finally:
            signals.started()  # from here on a signal only sets signals.stop
        # Announced only now: a stop signal after "ready" is a normal shutdown, not an
        # interrupted start-up.
        node.log_ready()
        executor = MultiThreadedExecutor(num_threads=node.executor_threads())
        executor.add_node(node)
        while rclpy.ok() and not signals.stop.is_set():
            executor.spin_once(timeout_sec=0.2)
        if node.activating:  # a manager's activate, on an executor thread: stop it the same
            raise process_life.StartupInterrupted(signals.signum or signal.SIGTERM)
    except process_life.StartupInterrupted as e:
        # The engine may be half built on its loop thread: its processes are killed rather
        # than shut down (that would wait for the start to finish first).
        ended = process_life.end_interrupted_start()
        logger.info(f"interrupted during start-up by {e.signal_name}: engine start stopped "
                    f"({len(ended)} process(es) ended), exiting")
        rclpy.try_shutdown()
        _exit_now(0)
    except ConfigError as e:
        logger.fatal(str(e))
        code = 2
    except CosmosReasonError as e:
        logger.fatal(f"engine failed to start: {e.message}")
        code = 1
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        t_stop = time.monotonic()
        if node is not None and signals.signum is not None:
            busy = f"goals_running={node.slots.running} goals_queued={node.slots.queued}" \
                if node.configured else f"lifecycle_state={node.lifecycle_state}"
            logger.info(f"{signal.Signals(signals.signum).name} received: stopping ({busy})")
        if node is not None:
            node.release(spin=None if executor is None
                         else lambda t: executor.spin_once(timeout_sec=t))
        if executor is not None:
            executor.shutdown(timeout_sec=2.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    if code == 0 and node is not None:
        logger.info(f"shut down cleanly in {time.monotonic() - t_stop:.1f} s")
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    # Everything is closed by now. The interpreter's own teardown of torch and vLLM modules
    # took 6-15 s on a loaded machine, long enough for launch to escalate to SIGKILL, so the
    # process ends here once its output is flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
