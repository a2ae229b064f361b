"""The node's ``/diagnostics`` status: engine, camera, goals, latencies, background work.

Built from a ``NodeReport`` (what the node reads of itself at one moment), never from the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

from cosmos_reason_ros.client import status_name
from cosmos_reason_ros.core.params import NodeParams
from cosmos_reason_ros.core.pipeline import UNAVAILABLE_STATES
from cosmos_reason_ros.core.stats import percentile
from cosmos_reason_ros.engines.base import EngineHealth


@dataclass(frozen=True)
class CameraReport:
    """One camera's part of the status, read at one moment."""

    name: str
    image_topic: str  # resolved (remaps applied): a viewer (the console) shows what it sees
    received: int
    stored: int
    newest_stamp_ns: int | None
    silent_s: float | None  # since its last frame arrived; None before one


@dataclass(frozen=True)
class NodeReport:
    """What ``/diagnostics`` reports, read from the node at one moment (``ReasonNode.report``).

    The status is built from this alone, so it never reaches into the node. Unconfigured (or
    finalized), only the name and the lifecycle state are reported; the rest is left empty.
    """

    name: str  # the node's full name
    lifecycle_state: str
    configured: bool = False
    params: NodeParams | None = None
    health: EngineHealth | None = None
    model_name: str = ""
    now_ns: int = 0
    camera: CameraReport | None = None  # the default camera
    named_cameras: tuple[CameraReport, ...] = ()  # every camera, with cameras.names
    goals_active: int = 0
    goals_queued: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    latencies: tuple[tuple[float, float], ...] = ()  # (ttft_s, total_s) of recent goals
    periodic: dict[str, object] = field(default_factory=dict)
    gc: dict[str, object] = field(default_factory=dict)
    detections_left_out: int = 0
    prefill: dict[str, object] = field(default_factory=dict)


def node_status(report: NodeReport) -> DiagnosticStatus:
    """One status: engine, cameras, goals, latency percentiles and periodic/prefill counters.

    ``frames_received`` / ``frame_age_s`` are the default camera's; with named cameras every
    camera also has ``<name>.frames_received`` / ``<name>.frame_age_s``, and any silent
    camera raises the level.
    """
    name = status_name(report.name)
    if not report.configured:  # unconfigured or finalized: only the state to report
        return DiagnosticStatus(
            level=DiagnosticStatus.WARN, name=name,
            message=f"lifecycle state {report.lifecycle_state}",
            values=[KeyValue(key="lifecycle_state", value=report.lifecycle_state)])
    p, health, camera = report.params, report.health, report.camera
    assert p is not None and health is not None and camera is not None
    counters = report.counters
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
    if not report.named_cameras:
        level = _camera_level(p, camera.silent_s, "camera", level, problems)
    camera_values: dict[str, object] = {}
    for named in report.named_cameras:
        # Per named camera: a wrist camera that stopped fails every goal naming it.
        level = _camera_level(p, named.silent_s, f"camera {named.name}", level, problems)
        camera_values[f"{named.name}.frames_received"] = named.received
        camera_values[f"{named.name}.image_topic"] = named.image_topic
        camera_values[f"{named.name}.frame_age_s"] = _age(report.now_ns, named)
    if report.lifecycle_state != "active":
        level = max(level, DiagnosticStatus.WARN)
        problems.append(f"lifecycle state {report.lifecycle_state}")
    values = {
        "lifecycle_state": report.lifecycle_state, "engine_state": health.state.value,
        "model": health.model or report.model_name,
        "engine_running_requests": health.running_requests,
        "image_topic": camera.image_topic,
        "frames_received": camera.received, "frames_stored": camera.stored,
        "frame_age_s": _age(report.now_ns, camera),
        **camera_values,
        "goals_active": report.goals_active, "goals_queued": report.goals_queued,
        **{f"goals_{k}": v for k, v in counters.items()},
        **{f"periodic_{k}": v for k, v in report.periodic.items()},
        **{f"gc_{k}": round(v, 4) if isinstance(v, float) else v
           for k, v in report.gc.items()},
        "detections_left_out": report.detections_left_out,
        "prefill_enabled": p.prefill.enabled,
        **{(k if k.startswith("goals") else f"prefill_{k}"): v
           for k, v in report.prefill.items()},
    }
    for i, series_name in ((0, "ttft"), (1, "total")):
        series = [x[i] for x in report.latencies]
        for q in (50, 95):
            values[f"{series_name}_p{q}_s"] = f"{percentile(series, q):.4f}" if series else ""
    return DiagnosticStatus(
        level=level, name=name, hardware_id=report.model_name,
        message="; ".join(problems) or "ok",
        values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])


def _age(now_ns: int, camera: CameraReport) -> str:
    """Return the age of the camera's newest frame by its stamp, in seconds ("" before one)."""
    return "" if camera.newest_stamp_ns is None \
        else f"{(now_ns - camera.newest_stamp_ns) / 1e9:.3f}"


def _camera_level(p: NodeParams, silent_s: float | None, what: str, level: int,
                  problems: list[str]) -> int:
    """Return ``level`` raised for a camera silent past the thresholds (noted in problems)."""
    if silent_s is not None and silent_s <= p.diagnostics.camera_warn_s:
        return level
    error = silent_s is None or silent_s > p.diagnostics.camera_error_s
    problems.append(f"no {what} frames yet" if silent_s is None
                    else f"{what} silent for {silent_s:.1f} s")
    return max(level, DiagnosticStatus.ERROR if error else DiagnosticStatus.WARN)
