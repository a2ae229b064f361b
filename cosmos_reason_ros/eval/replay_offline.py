"""Replay offline: the node's very requests built from the bag's frames, run on an engine.

No ROS: frames, depth and CameraInfo come from the bag as of each query's time; answers are
lifted to 3D as the node lifts them.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cosmos_reason_ros.core.answer3d import Answer3D, LiftCode
from cosmos_reason_ros.core.cameras import DEFAULT_CAMERA
from cosmos_reason_ros.core.lifting import Lifted
from cosmos_reason_ros.core.rgbd import CameraModel
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode
from cosmos_reason_ros.eval import bagio
from cosmos_reason_ros.eval.replay_records import (
    EXIT_BAD_INPUT,
    NS,
    REPO_ROOT,
    SOURCES,
    Recorder,
    ReplayConfig,
    ReplayError,
    error_result,
    stamp_plain,
)
from cosmos_reason_ros.eval.scenario import ScheduledQuery

_LOG = logging.getLogger("replay")




# --- offline ------------------------------------------------------------------------------------


def _preset_path(preset: str) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidates = [REPO_ROOT / "config" / f"{preset}.yaml"]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("cosmos_reason_ros")) / "config"
                          / f"{preset}.yaml")
    except Exception:  # noqa: BLE001 - not installed: the source tree's presets only
        pass
    for c in candidates:
        if c.is_file():
            return c
    raise ReplayError(f"--preset {preset!r}: no such preset file (looked for "
                      f"{', '.join(str(c) for c in candidates)})", EXIT_BAD_INPUT)


class OfflineRunner:
    """Answers scheduled queries from the bag's frames with an engine, as the node would."""

    def __init__(self, cfg: ReplayConfig, engine: Any = None) -> None:
        """Load the preset (the node's parameter table) and start its engine (or ``engine``).

        ``cfg.params`` override the preset's parameters (e.g. ``depth.enabled``). With depth
        on, the bag's depth and CameraInfo topics are chosen before the engine starts.
        """
        from cosmos_reason_ros.config import (
            ConfigError,
            create_configured_engine,
            load_yaml_params,
            validate,
        )
        from cosmos_reason_ros.core.models import detect_profile
        from cosmos_reason_ros.engines.runner import EngineRunner

        self.cfg = cfg
        try:
            values = load_yaml_params(str(_preset_path(cfg.preset)))
            values.update(cfg.params)
            if cfg.model:
                values["engine.model"] = cfg.model
            if cfg.cameras:  # the node would run with these cameras, in this order
                names = list(values.get("cameras.names") or cfg.cameras)
                if names != list(cfg.cameras):
                    raise ConfigError(f"cameras.names={names!r} differs from the cameras "
                                      f"mapped to the bag's topics ({', '.join(cfg.cameras)})")
                values["cameras.names"] = names
            p = self.params = validate(values)
            self.profile = detect_profile(p.engine.model or "unknown",
                                          None if p.model.family == "auto"
                                          else p.model.family)
        except (ConfigError, CosmosReasonError) as e:
            raise ReplayError(f"--preset/--model/--param: {e}", EXIT_BAD_INPUT) from e
        self.depth_topics: tuple[str, str] | None = None
        if p.depth.enabled:
            try:
                self.depth_topics = bagio.pick_depth_topics(
                    bagio.bag_info(cfg.bag), cfg.depth_topic, cfg.camera_info_topic)
            except bagio.BagError as e:
                raise ReplayError(f"depth.enabled: {e}", EXIT_BAD_INPUT) from e
            if p.depth.target_frame:
                _LOG.warning("depth.target_frame=%s is ignored offline (no tf): positions stay "
                             "in the camera's optical frame", p.depth.target_frame)
        try:
            self.runner = EngineRunner(engine or create_configured_engine(p.engine))
        except ConfigError as e:
            raise ReplayError(f"--preset/--model/--param: {e}", EXIT_BAD_INPUT) from e
        try:
            self.runner.start(timeout_s=p.engine.start_timeout_s)
        except CosmosReasonError as e:
            self.runner.close()
            raise ReplayError(f"engine did not start: {e.message}") from e

    def close(self) -> None:
        """Shut the engine down."""
        self.runner.close()

    def run(self, schedule: tuple[ScheduledQuery, ...], info: bagio.BagInfo, image_topic: str,
            recorder: Recorder, tick: Callable[[], None]) -> None:
        """Step through the bag's frames and answer each query at its time, as the node would.

        Frames (and depth frames) are stored serialized, as the node stores them, in histories
        whose clock is the query's bag time; the latest CameraInfo is kept as the camera
        model; the node's goal pipeline chooses, decodes, asks and lifts.
        """
        from cosmos_reason_ros.core.cdr import header_stamp_ns, read_stored_frame
        from cosmos_reason_ros.core.frames import FrameHistory
        from cosmos_reason_ros.core.pipeline import GoalPipeline

        p = self.params
        now = [info.start_ns]
        # One history per camera (the node's cameras.names, mapped to the bag's topics), the
        # default camera first; without named cameras the one camera on image_topic.
        camera_topics = dict(self.cfg.cameras) or {DEFAULT_CAMERA: image_topic}
        histories: dict[str, FrameHistory[tuple[bool, bytes]]] = {
            name: FrameHistory(max_frames=p.image.history_frames,
                               max_bytes=int(p.image.history_mb * 2**20), clock=lambda: now[0])
            for name in camera_topics}
        by_topic = {topic: histories[name] for name, topic in camera_topics.items()}
        depth_history: FrameHistory[tuple[bool, bytes]] | None = None
        camera = _CameraInfoReader(p.depth.rectified)
        topics = list(by_topic)
        depth_topic = ""
        if self.depth_topics is not None:
            depth_topic = self.depth_topics[0]
            clash = sorted(set(topics) & set(self.depth_topics))
            if clash:
                raise ReplayError(f"the image topic {clash[0]} is also the depth or "
                                  f"camera_info topic", EXIT_BAD_INPUT)
            depth_history = FrameHistory(max_frames=p.depth.history_frames,
                                         clock=lambda: now[0])
            topics += list(self.depth_topics)
        default = next(iter(camera_topics))
        self.pipeline = GoalPipeline.from_params(
            p, self.profile, self.runner, histories, read_stored_frame, lambda: now[0],
            depth_history=depth_history, camera_model=camera.model,
            source_name=f"{default} ({image_topic})" if self.cfg.cameras else image_topic)
        stream: Iterator[tuple[str, str, int, bytes]] = bagio.messages(info.path, topics)
        ahead = next(stream, None)

        def store() -> tuple[str, int]:
            """Store the message ahead; return its topic and receipt time, and step on."""
            nonlocal ahead
            assert ahead is not None
            topic, msgtype, t_recv, data = ahead
            ahead = next(stream, None)
            if topic in by_topic:
                by_topic[topic].append((msgtype == bagio.COMPRESSED_TYPE, data),
                                       header_stamp_ns(data) or t_recv, nbytes=len(data),
                                       received_ns=t_recv)
            elif topic == depth_topic and depth_history is not None:
                depth_history.append((False, data), header_stamp_ns(data) or t_recv,
                                     nbytes=len(data), received_ns=t_recv)
            elif msgtype == bagio.CAMERA_INFO_TYPE:
                camera.update(data, msgtype)
            return topic, t_recv

        for item in schedule:
            t_ns = info.start_ns + int(round(item.t_s * NS))
            now[0] = t_ns
            while ahead is not None and ahead[2] <= t_ns:
                store()
            if item.query.goal.source == "next":
                # The colour frame of each of the goal's cameras that arrives after the goal,
                # and whatever arrived with the last of them.
                waiting = {camera_topics[c] for c in item.query.goal.cameras or (default,)}
                while ahead is not None and waiting:
                    topic, t_recv = store()
                    waiting.discard(topic)
                    if not waiting:
                        while ahead is not None and ahead[2] <= t_recv:
                            store()
            status, plain = self.answer(item, t_ns)
            recorder.add(item, status, plain)
            tick()

    def answer(self, item: ScheduledQuery, t_ns: int) -> tuple[str, dict[str, Any]]:
        """One query through the goal pipeline; errors become error results."""
        from cosmos_reason_ros.core.pipeline import GoalFields

        g = item.query.goal
        t0 = time.monotonic()
        fields = GoalFields(
            task=g.task, prompt=g.prompt, targets=tuple(g.targets), reasoning=g.reasoning,
            source=SOURCES[g.source], max_image_age_s=g.max_image_age_s,
            # Offline nothing arrives later: a 'next' frame is stored before asking.
            wait_for_image_s=g.wait_for_image_s or 0.001, clip_duration_s=g.clip_duration_s,
            clip_fps=g.clip_fps, response_schema=g.response_schema, max_tokens=g.max_tokens,
            temperature=g.temperature, greedy=g.greedy, timeout_s=g.timeout_s,
            cameras=g.cameras)
        header: dict[str, Any] = {}
        try:
            valid = self.pipeline.validate(fields)
            run = self.pipeline.run(valid, t_start=t0, accepted_ns=t_ns)
            if run.media is not None:
                header = {"stamp": stamp_plain(run.media.header_stamp_ns),
                          "frame_id": run.media.frame_id}
            if run.error is not None:
                raise run.error
        except CosmosReasonError as e:
            plain = error_result(e, item, self.runner.model_name, header)
            plain["total_s"] = time.monotonic() - t0
            return "aborted", plain
        assert run.media is not None and run.outcome is not None
        plain = outcome_plain(run.outcome, run.media.prepared.geometry, run.media.stamps_ns,
                              run.media.clip_start_ns, run.answer3d)
        plain.update(header=header, goal_id=uuid.uuid4().hex, origin="goal",
                     camera_frames=[_camera_frame_plain(c) for c in run.media.cameras],
                     model=self.runner.model_name, task=valid.spec.task.value, prompt=g.prompt,
                     preprocess_s=run.preprocess_s,
                     time_to_first_token_s=run.time_to_first_token_s,
                     total_s=time.monotonic() - t0)
        return "succeeded", plain


def _camera_frame_plain(camera: Any) -> dict[str, Any]:
    """Return a ``CameraFrame`` in plain form, as ``ros/messages.camera_frame`` fills it."""
    g = camera.geometry
    return {"camera": camera.camera, "header": {"stamp": stamp_plain(camera.header_stamp_ns),
                                                "frame_id": camera.frame_id},
            "image_width": g.original_width, "image_height": g.original_height,
            "input_width": g.input_width, "input_height": g.input_height}


class _CameraInfoReader:
    """The latest CameraInfo of the bag as a ``CameraModel``, read as the node reads it."""

    def __init__(self, rectified: bool) -> None:
        self.rectified = rectified
        self._model: CameraModel | None = None
        self._warned: set[str] = set()

    def model(self) -> CameraModel | None:
        """Return the latest camera model (None before a usable CameraInfo)."""
        return self._model

    def update(self, data: bytes, msgtype: str) -> None:
        """Read one serialized CameraInfo; a bad one is ignored with a warning, as the node does."""
        msg = bagio.typestore().deserialize_cdr(data, msgtype)
        try:
            model = CameraModel.from_camera_info_fields(
                msg.k, msg.d, msg.width, msg.height, msg.header.frame_id, msg.distortion_model,
                msg.p, rectified=self.rectified)
        except CosmosReasonError as e:
            self._warn_once("bad", f"camera_info ignored: {e.message}")
            return
        if model.has_distortion:
            self._warn_once("distortion", "camera_info has non-zero distortion and "
                            "depth.rectified is false: 3D positions assume a rectified colour "
                            "image")
        self._model = model

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _LOG.warning(message)


def _position_plain(lifted: Lifted) -> dict[str, Any]:
    """Return a ``Position3D`` in plain form (NaN as None), as ``messages.fill_3d`` fills it."""
    def num(v: float) -> float | None:
        return None if math.isnan(v) else float(v)

    x, y, z = lifted.position
    sx, sy, sz = lifted.size
    qx, qy, qz, qw = lifted.orientation
    return {"valid": bool(lifted.valid), "position": {"x": num(x), "y": num(y), "z": num(z)},
            "size": {"x": num(sx), "y": num(sy), "z": num(sz)},
            "orientation": {"x": qx, "y": qy, "z": qz, "w": qw},
            "depth_pixels": int(lifted.used_pixels), "status": lifted.reason}


def outcome_plain(outcome: Any, geometry: Any, stamps_ns: list[int],
                  clip_start_ns: int | None, answer3d: Answer3D | None = None
                  ) -> dict[str, Any]:
    """Return the plain ``ReasoningResult`` fields of an outcome (the node's ``fill_outcome``).

    With ``answer3d`` the 3D fields too, as ``fill_3d`` fills them: ``lift_code``,
    ``lift_message``, ``frame_3d``, ``depth_stamp``, and each box's, point's and waypoint's
    ``position_3d`` when lifting went ahead.
    """
    parsed = outcome.parsed

    def point(pt: Any) -> dict[str, Any]:
        return {"label": pt.label, "camera": pt.camera, "x": float(pt.x), "y": float(pt.y)}

    start = clip_start_ns or 0
    plain = {
        "frame_stamps": [stamp_plain(s) for s in stamps_ns],
        "raw_text": parsed.raw_text, "reasoning": parsed.reasoning, "answer": parsed.answer,
        "answer_json": parsed.answer_json or "",
        "boxes": [{"label": b.label, "camera": b.camera,
                   "score": None if b.score is None else float(b.score),
                   "x_min": float(b.x_min), "y_min": float(b.y_min), "x_max": float(b.x_max),
                   "y_max": float(b.y_max), "degenerate": bool(b.degenerate)}
                  for b in outcome.boxes],
        "points": [point(pt) for pt in outcome.points],
        "trajectories": [{"label": t.label, "camera": t.camera,
                          "points": [point(pt) for pt in t.points]}
                         for t in outcome.trajectories],
        "spans": [{"start_s": float(s.start_s), "end_s": float(s.end_s), "caption": s.caption,
                   "start_stamp": stamp_plain(start + s.start_s * NS),
                   "end_stamp": stamp_plain(start + s.end_s * NS)} for s in parsed.spans],
        "parsed": list(parsed.found), "parse_problems": list(parsed.problems),
        "image_width": geometry.original_width, "image_height": geometry.original_height,
        "input_width": geometry.input_width, "input_height": geometry.input_height,
        "prompt_tokens": outcome.tokens.prompt, "output_tokens": outcome.tokens.output,
        "cached_prompt_tokens": outcome.tokens.cached_prompt,
        "finish_reason": outcome.finish_reason.value, "error_code": int(ErrorCode.OK),
    }
    if answer3d is not None:
        _plain_3d(plain, answer3d)
    return plain


def _plain_3d(plain: dict[str, Any], answer: Answer3D) -> None:
    """Add an ``Answer3D`` to a plain result, as ``ros/messages.fill_3d`` does to a message."""
    plain.update(lift_code=int(answer.code), lift_message=answer.message,
                 frame_3d=answer.frame_id, depth_stamp=stamp_plain(answer.depth_stamp_ns))
    if answer.code not in (LiftCode.OK, LiftCode.TF_FAILED):
        return
    for box, lifted in zip(plain["boxes"], answer.boxes, strict=True):
        box["position_3d"] = _position_plain(lifted)
    for pt, lifted in zip(plain["points"], answer.points, strict=True):
        pt["position_3d"] = _position_plain(lifted)
    for trajectory, waypoints in zip(plain["trajectories"], answer.trajectories, strict=True):
        for pt, lifted in zip(trajectory["points"], waypoints, strict=True):
            pt["position_3d"] = _position_plain(lifted)
