"""The node's ``/diagnostics`` status: engine, camera, goals, latencies, background work."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from cosmos_reason_ros.client import status_name
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.pipeline import UNAVAILABLE_STATES
from cosmos_reason_ros.core.stats import percentile

if TYPE_CHECKING:
    from cosmos_reason_ros.ros.node import ReasonNode


def publish(node: ReasonNode) -> None:
    """Publish the node's status on ``/diagnostics`` (its timer; nothing once shut down)."""
    if not node.context.ok():
        return
    array = DiagnosticArray(status=[node_status(node)])
    array.header.stamp = node.get_clock().now().to_msg()
    node.diagnostics_pub.publish(array)


def node_status(node: ReasonNode) -> DiagnosticStatus:
    """One status: engine, cameras, goals, latency percentiles and periodic/prefill counters.

    ``frames_received`` / ``frame_age_s`` are the default camera's; with named cameras every
    camera also has ``<name>.frames_received`` / ``<name>.frame_age_s``, and any silent
    camera raises the level.
    """
    if not node.configured:  # unconfigured or finalized: only the state to report
        return DiagnosticStatus(
            level=DiagnosticStatus.WARN, name=status_name(node.get_fully_qualified_name()),
            message=f"lifecycle state {node.lifecycle_state}",
            values=[KeyValue(key="lifecycle_state", value=node.lifecycle_state)])
    p = node.params
    health = node.runner.health()
    stats = node.history.stats()
    silent_s = None if node.last_frame_monotonic is None \
        else time.monotonic() - node.last_frame_monotonic
    latest = node.history.latest()
    frame_age_s = None if latest is None else (node.now_ns() - latest.stamp_ns) / 1e9
    counters = node.counters_snapshot()
    latencies = list(node.latencies)
    level, problems = DiagnosticStatus.OK, []
    if health.state.value != "ready":
        bad = health.state.value in UNAVAILABLE_STATES
        level = max(level, DiagnosticStatus.ERROR if bad else DiagnosticStatus.WARN)
        problems.append(f"engine {health.state.value}"
                        + (f": {health.detail}" if health.detail else ""))
    if health.problems:  # the engine is up, yet every goal fails (e.g. a rejected API key)
        level = DiagnosticStatus.ERROR
        problems.extend(health.problems)
    if counters.get("answered_from_reasoning"):
        level = max(level, DiagnosticStatus.WARN)
        problems.append(f"{counters['answered_from_reasoning']} answers only in the server's "
                        "reasoning channel (its --reasoning-parser)")
    if not node.cameras.named:
        level = _camera_level(p, silent_s, "camera", level, problems)
    camera_values: dict[str, object] = {}
    for camera in node.cameras if node.cameras.named else ():
        # Per named camera: a wrist camera that stopped fails every goal naming it.
        silent = None if camera.last_frame_monotonic is None \
            else time.monotonic() - camera.last_frame_monotonic
        level = _camera_level(p, silent, f"camera {camera.name}", level, problems)
        newest = camera.history.latest()
        camera_values[f"{camera.name}.frames_received"] = camera.history.stats().received
        camera_values[f"{camera.name}.image_topic"] = camera.image_topic
        camera_values[f"{camera.name}.frame_age_s"] = "" if newest is None \
            else f"{(node.now_ns() - newest.stamp_ns) / 1e9:.3f}"
    if node.lifecycle_state != "active":
        level = max(level, DiagnosticStatus.WARN)
        problems.append(f"lifecycle state {node.lifecycle_state}")
    values = {
        "lifecycle_state": node.lifecycle_state, "engine_state": health.state.value,
        "model": health.model or node.runner.model_name,
        "engine_running_requests": health.running_requests,
        # The resolved topic (remaps applied): a viewer (the console) shows what the node sees.
        "image_topic": node.camera.image_topic,
        "frames_received": stats.received, "frames_stored": stats.frames,
        "frame_age_s": "" if frame_age_s is None else f"{frame_age_s:.3f}",
        **camera_values,
        "goals_active": node.slots.running, "goals_queued": node.slots.queued,
        **{f"goals_{k}": v for k, v in counters.items()},
        **{f"periodic_{k}": v for k, v in node.periodic.snapshot().items()},
        **{f"gc_{k}": round(v, 4) if isinstance(v, float) else v
           for k, v in dataclasses.asdict(node.gc_pauses.stats()).items()},
        "detections_left_out": node.outputs.detections_left_out,
        "prefill_enabled": p.prefill.enabled,
        **{(k if k.startswith("goals") else f"prefill_{k}"): v
           for k, v in dataclasses.asdict(node.prefill.counts()).items()},
    }
    for i, name in ((0, "ttft"), (1, "total")):
        series = [x[i] for x in latencies]
        for q in (50, 95):
            values[f"{name}_p{q}_s"] = f"{percentile(series, q):.4f}" if series else ""
    return DiagnosticStatus(
        level=level, name=status_name(node.get_fully_qualified_name()),
        hardware_id=node.runner.model_name, message="; ".join(problems) or "ok",
        values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])


def _camera_level(p: NodeParams, silent_s: float | None, what: str, level: int,
                  problems: list[str]) -> int:
    """Return ``level`` raised for a camera silent past the thresholds (noted in problems)."""
    if silent_s is not None and silent_s <= p.diagnostics.camera_warn_s:
        return level
    error = silent_s is None or silent_s > p.diagnostics.camera_error_s
    problems.append(f"no {what} frames yet" if silent_s is None
                    else f"{what} silent for {silent_s:.1f} s")
    return max(level, DiagnosticStatus.ERROR if error else DiagnosticStatus.WARN)
