"""The engine-only mode: the in-process engine driven by the node's own goal pipeline."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cosmos_reason_ros.bench.workload import SERVED_NAME
from cosmos_reason_ros.core import query
from cosmos_reason_ros.core.cameras import CameraFrame
from cosmos_reason_ros.core.frames import FrameHistory, StoredFrame
from cosmos_reason_ros.core.imaging import ImageMessage
from cosmos_reason_ros.core.pipeline import GoalFields, GoalPipeline, Settings, Source, ValidGoal
from cosmos_reason_ros.core.types import ChatRequest


class EngineBench:
    """The in-process engine (the floor): the same query pipeline the node uses."""

    def __init__(self, model: str, settings: dict[str, Any], extras: dict[str, Any],
                 engine: Any = None) -> None:
        """Build (not start) the engine (or use ``engine``)."""
        from cosmos_reason_ros.core.models import detect_profile
        from cosmos_reason_ros.engines.factory import create_engine
        from cosmos_reason_ros.engines.runner import EngineRunner

        options = {k: v for k, v in settings.items() if v is not None}
        options.update(model=model, served_model_name=SERVED_NAME, extra_engine_args=extras)
        self.profile = detect_profile(model, None)
        self.runner = EngineRunner(engine or create_engine("vllm", options))
        # Requests are built by the node's pipeline (goal image source: no history needed).
        self.pipeline: GoalPipeline[Any] = GoalPipeline(
            Settings(self.profile, query.QueryLimits(max_tokens=1024)), self.runner,
            FrameHistory(max_frames=1), read_frame=lambda image: image, clock_ns=time.time_ns)
        self.start_s: float | None = None

    def start(self, timeout_s: float) -> None:
        """Load and warm up."""
        t0 = time.monotonic()
        self.runner.start(timeout_s=timeout_s)
        self.start_s = time.monotonic() - t0

    def submit(self, rgb: np.ndarray, prompt: str, max_tokens: int,
               ignore_eos: bool = True) -> Callable[[], dict[str, Any]]:
        """Submit one request; the returned function waits and gives its measurements.

        The request is the one the node builds for the same goal and frame (greedy, so no
        seed; ``ignore_eos`` as the node's ``limits.fixed_output_length``).
        """
        t0 = time.monotonic()
        image = _image_message(rgb)
        goal = self._goal(image, prompt, max_tokens, ignore_eos)
        return self._stream(t0, self.pipeline.build_request(goal,
                                                            self.pipeline.prepare_image(image)))

    def submit_cameras(self, pictures: Sequence[tuple[str, np.ndarray]], prompt: str,
                       max_tokens: int, ignore_eos: bool = True) -> Callable[[], dict[str, Any]]:
        """Submit one request about named cameras' pictures (one image each, in order).

        Built as the node builds a goal about those cameras (``prepare_cameras``: each picture
        decoded and resized alone, the prompt naming the cameras when there are several).
        """
        t0 = time.monotonic()
        frames = []
        for i, (name, rgb) in enumerate(pictures):
            image = _image_message(rgb)
            frames.append(CameraFrame(name, StoredFrame(image.stamp_ns, image.stamp_ns, image,
                                                        rgb.nbytes, i + 1)))
        goal = self._goal(frames[0].frame.payload, prompt, max_tokens, ignore_eos)
        return self._stream(t0, self.pipeline.build_request(
            goal, self.pipeline.prepare_cameras(tuple(frames))))

    def _goal(self, image: ImageMessage, prompt: str, max_tokens: int,
              ignore_eos: bool) -> ValidGoal:
        """Validate a short question about ``image`` through the node's pipeline."""
        goal = self.pipeline.validate(GoalFields(
            task="vqa", prompt=prompt, max_tokens=max_tokens, greedy=True,
            source=Source.GOAL_IMAGE, image=image, images_in_goal=1), check_engine=False)
        sampling = dataclasses.replace(goal.spec.sampling, ignore_eos=ignore_eos)
        return dataclasses.replace(goal, spec=dataclasses.replace(goal.spec, sampling=sampling))

    def _stream(self, t0: float, request: ChatRequest) -> Callable[[], dict[str, Any]]:
        """Submit ``request``; the returned function streams it and gives the measurements."""
        handle = self.runner.submit(request)

        def wait() -> dict[str, Any]:
            ttft = None
            out = query.OutputAccumulator()
            for chunk in handle.iter_chunks(600.0):
                if ttft is None and (chunk.text_delta or chunk.reasoning_delta):
                    ttft = time.monotonic() - t0
                out.add(chunk)
            e2e = time.monotonic() - t0
            return {"ok": True, "ttft_s": ttft, "e2e_s": e2e,
                    "output_tokens": out.output_tokens, "prompt_tokens": out.prompt_tokens,
                    "cached_prompt_tokens": out.cached_prompt_tokens,
                    "finish": out.finish_reason.value if out.finish_reason else None,
                    "images": len(request.images)}

        return wait

    def close(self) -> None:
        """Shut the engine down."""
        self.runner.close(timeout_s=30.0)


def _image_message(rgb: np.ndarray) -> ImageMessage:
    """Wrap an RGB picture as the rgb8 image message a camera would send (no copy)."""
    height, width = rgb.shape[:2]
    pixels = memoryview(np.ascontiguousarray(rgb)).cast("B")
    return ImageMessage(stamp_ns=time.time_ns(), frame_id="bench", width=width, height=height,
                        encoding="rgb8", step=width * 3, data=pixels)
