"""One query from goal fields to a finished outcome, without ROS or an engine.

The node, the offline replay and the benchmarks all go through these steps, so a question
asked through the action server and the same question asked offline produce byte-identical
requests:

1. ``make_spec``: validate the goal's text, task, targets, schema and sampling once.
2. ``prepare_image`` / ``prepare_clip``: resize RGB frames to the model's pixel budget (a size
   the model's processor keeps as is) and remember the geometry for mapping coordinates back.
3. ``build_request``: chat messages (media first), schema and sampling -> ``ChatRequest``.
4. ``finish``: parse the output and map boxes, points and trajectories to original pixels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_reason_ros.core import geometry, imaging, parsing, prompts
from cosmos_reason_ros.core.models import ModelProfile
from cosmos_reason_ros.core.types import (
    BadImageError,
    BadRequestError,
    ChatRequest,
    FinishReason,
    ImageGeometry,
    PromptTooLongError,
    ReasonOutcome,
    Sampling,
    Task,
    Timings,
    TokenCounts,
    Video,
)


@dataclass(frozen=True)
class QueryLimits:
    """Bounds applied to every goal (the node's ``limits.*`` parameters)."""

    max_tokens: int = 4096
    max_prompt_chars: int = prompts.MAX_PROMPT_CHARS
    max_schema_bytes: int = prompts.MAX_SCHEMA_BYTES
    max_image_pixels: int = 0  # package resize budget per image; 0 = the profile's default
    # Images one request may carry (the engine's limit_mm_per_prompt "image"); every camera
    # of a goal sends one. 0 = prompts.MAX_IMAGES.
    max_images: int = 0
    # The engine's context length (engine.max_model_len): a request whose images alone fill
    # it is refused before it reaches the engine. 0 = left to the engine.
    max_model_len: int = 0

    @property
    def images_per_request(self) -> int:
        """The most images one request may carry."""
        return min(self.max_images, prompts.MAX_IMAGES) if self.max_images > 0 \
            else prompts.MAX_IMAGES


@dataclass(frozen=True)
class QuerySpec:
    """A validated question: what to ask and how to sample, independent of the image."""

    task: Task
    prompt: str
    targets: tuple[str, ...]
    reasoning: bool
    sampling: Sampling
    user_schema: dict[str, Any] | None = None
    constrain: bool = True  # constrain structured tasks with their own schema


@dataclass(frozen=True)
class CameraView:
    """One named camera's image in a request: the name the prompt uses and its geometry."""

    camera: str
    geometry: ImageGeometry


@dataclass(frozen=True)
class PreparedMedia:
    """Model-ready pixels (one image, a clip, or one image per camera) and their geometry.

    ``geometry`` is the (first) image's. ``views`` names the cameras the media came from, in
    image order: empty for an image without a camera (the goal's own), one for a camera's
    image or clip, one per image for a multi-camera request (built by
    :func:`combine_cameras`), whose answers are mapped back per camera.
    """

    geometry: ImageGeometry
    images: tuple[np.ndarray, ...] = ()
    video: Video | None = None
    views: tuple[CameraView, ...] = ()

    @property
    def cameras(self) -> tuple[str, ...]:
        """The camera names, in image order (empty without cameras)."""
        return tuple(v.camera for v in self.views)


def combine_cameras(named: Sequence[tuple[str, PreparedMedia]]) -> PreparedMedia:
    """Name prepared media by camera; several cameras' images become one request's media.

    One camera: its image or clip, named. Several: their images in the order given (each
    already resized within the per-image budget), each with its own geometry.
    """
    if not named:
        raise BadRequestError("a request needs at least one camera's media")
    if len(named) == 1:
        camera, media = named[0]
        return dataclasses.replace(media, views=(CameraView(camera, media.geometry),))
    for camera, media in named:
        if media.video is not None or len(media.images) != 1:
            raise BadRequestError(f"camera {camera!r}: a multi-camera request takes one image "
                                  f"per camera, not a clip")
    return PreparedMedia(
        named[0][1].geometry, images=tuple(m.images[0] for _c, m in named),
        views=tuple(CameraView(camera, m.geometry) for camera, m in named))


def check_media_limits(profile: ModelProfile, media: PreparedMedia,
                       limits: QueryLimits) -> None:
    """Refuse media the engine cannot take: too many images, or images that fill the context.

    Every image counts (one per camera). The context check is a lower bound (the images'
    visual tokens, without the text), so it never refuses a request the engine would take.
    """
    allowed = limits.images_per_request
    if len(media.images) > allowed:
        raise BadRequestError(
            f"the request has {len(media.images)} images; at most {allowed} fit one request "
            f"(the engine's limit_mm_per_prompt)")
    if limits.max_model_len <= 0:
        return
    tokens = [profile.visual_tokens(int(i.shape[1]), int(i.shape[0])) for i in media.images]
    if media.video is not None:
        height, width = media.video.frames[0].shape[:2]
        tokens.append(profile.video_tokens(int(width), int(height), len(media.video.frames)))
    if sum(tokens) >= limits.max_model_len:
        names = media.cameras if len(media.cameras) == len(tokens) else ("",) * len(tokens)
        parts = " + ".join(f"{n} ({name})" if name else str(n)
                           for n, name in zip(tokens, names, strict=True))
        raise PromptTooLongError(
            f"the images alone take {sum(tokens)} visual tokens ({parts}), and "
            f"engine.max_model_len is {limits.max_model_len}; use fewer cameras or frames, a "
            f"smaller model.max_pixels, or raise the context")


def make_spec(
    profile: ModelProfile,
    *,
    task: str | Task = "",
    prompt: str = "",
    targets: Iterable[str] = (),
    reasoning: bool = False,
    response_schema: str = "",
    max_tokens: int = 0,
    temperature: float = 0.0,
    greedy: bool = False,
    seed: int | None = None,
    limits: QueryLimits = QueryLimits(),
    constrain: bool = True,
) -> QuerySpec:
    """Validate goal fields into a ``QuerySpec``; raise ``BadRequestError`` naming the field."""
    task_enum, prompt, cleaned = prompts.validate_goal_text(
        task, prompt, targets, limits.max_prompt_chars
    )
    user_schema = prompts.parse_response_schema(response_schema, limits.max_schema_bytes)
    sampling = prompts.sampling_for(
        profile, task_enum, reasoning, max_tokens=max_tokens, temperature=temperature,
        seed=seed, max_tokens_cap=limits.max_tokens,
    )
    if greedy:  # vLLM treats temperature below 1e-5 as greedy; 0 is exact
        sampling = dataclasses.replace(sampling, temperature=0.0, top_p=1.0, top_k=None)
    return QuerySpec(task_enum, prompt, cleaned, bool(reasoning), sampling, user_schema,
                     constrain)


def _budget(profile: ModelProfile, limits: QueryLimits) -> int:
    return limits.max_image_pixels or profile.default_max_pixels


def input_size(profile: ModelProfile, width: int, height: int,
               limits: QueryLimits = QueryLimits()) -> tuple[int, int]:
    """Return the size the model sees for a ``width`` x ``height`` image."""
    return profile.input_size(width, height, _budget(profile, limits))


def prepare_image(
    profile: ModelProfile,
    rgb: np.ndarray,
    limits: QueryLimits = QueryLimits(),
    original_size: tuple[int, int] | None = None,
) -> PreparedMedia:
    """Resize one RGB frame to the model's input size; keep the geometry.

    ``original_size`` (width, height) is given when ``rgb`` was already converted at the input
    size (conversion and resize in one pass); the resize is then a no-op.
    """
    width, height = original_size or (int(rgb.shape[1]), int(rgb.shape[0]))
    in_w, in_h = input_size(profile, width, height, limits)
    resized = imaging.resize_rgb(rgb, in_w, in_h)
    return PreparedMedia(ImageGeometry(width, height, in_w, in_h), images=(resized,))


def prepare_clip(
    profile: ModelProfile,
    frames: Sequence[np.ndarray],
    stamps_ns: Sequence[int],
    fps: float,
    limits: QueryLimits = QueryLimits(),
) -> PreparedMedia:
    """Resize a clip's RGB frames to one size within the video budget; keep times."""
    if not frames:
        raise BadRequestError("the clip has no frames")
    height, width = int(frames[0].shape[0]), int(frames[0].shape[1])
    for i, frame in enumerate(frames):
        if frame.shape[:2] != (height, width):
            raise BadImageError(
                f"clip frame {i} is {frame.shape[1]}x{frame.shape[0]}; every frame must be "
                f"{width}x{height} like the first"
            )
    in_w, in_h = profile.video_frame_size(width, height, len(frames))
    resized = tuple(imaging.resize_rgb(f, in_w, in_h) for f in frames)
    start = stamps_ns[0]
    times = tuple((s - start) / 1e9 for s in stamps_ns)
    video = Video(frames=resized, timestamps_s=times, fps=float(fps))
    return PreparedMedia(ImageGeometry(width, height, in_w, in_h), video=video)


def request_schema(
    profile: ModelProfile, spec: QuerySpec, media: PreparedMedia,
    engine_constrains_after_reasoning: bool = False,
) -> dict[str, Any] | None:
    """Return the schema to constrain decoding with, or ``None``.

    A schema applied from the first token forbids a ``<think>`` block, so with reasoning on
    it is used only where the engine starts constraining after ``</think>``.
    """
    if spec.reasoning and not engine_constrains_after_reasoning:
        return None
    if spec.user_schema is not None:
        return spec.user_schema
    if not spec.constrain:
        return None
    geometries = [v.geometry for v in media.views] or [media.geometry]
    # One bound for all images: the largest input side of any (INPUT_PIXELS coordinates).
    size = (max(g.input_width for g in geometries), max(g.input_height for g in geometries))
    return prompts.task_schema(spec.task, spec.targets, profile.coordinates, size,
                               media.cameras)


def build_request(
    request_id: str,
    profile: ModelProfile,
    spec: QuerySpec,
    media: PreparedMedia,
    *,
    engine_constrains_after_reasoning: bool = False,
    priority: int = 0,
    limits: QueryLimits | None = None,
    session_key: str = "",
) -> ChatRequest:
    """Assemble the engine request for a spec and prepared media (limits: the media's).

    ``session_key`` routes it behind a router (``core/routing.py``).
    """
    if limits is not None:
        check_media_limits(profile, media, limits)
    messages = prompts.build_request_messages(
        profile, spec.task, spec.prompt, spec.targets, spec.reasoning,
        n_images=len(media.images), video=media.video is not None, cameras=media.cameras,
    )
    schema = request_schema(profile, spec, media, engine_constrains_after_reasoning)
    return ChatRequest(
        request_id=request_id, messages=messages, sampling=spec.sampling, images=media.images,
        video=media.video, json_schema=schema, priority=priority, reasoning=spec.reasoning,
        session_key=session_key,
    )


PREFILL_PRIORITY = 2  # lowest: goals run at 0, periodic runs at 1 (vLLM: larger = later)


def build_prefill_request(
    request_id: str,
    profile: ModelProfile,
    media: PreparedMedia,
    *,
    reasoning: bool = False,
    session_key: str = "",
) -> ChatRequest:
    """Build a one-token request over only the shared prefix (system turn + media).

    Every goal about the same prepared media starts with exactly these messages and pixels
    (``build_request`` extends the same media turn with its text), so once this request has
    run, the engine's prefix and multimodal caches serve that part of the goal's prompt.
    """
    messages = prompts.prefix_messages(
        profile, n_images=len(media.images), video=media.video is not None, reasoning=reasoning,
    )
    return ChatRequest(
        request_id=request_id, messages=messages, sampling=Sampling(max_tokens=1, temperature=0.0),
        images=media.images, video=media.video, priority=PREFILL_PRIORITY, reasoning=reasoning,
        session_key=session_key,
    )


@dataclass
class OutputAccumulator:
    """Collects streamed chunks of one generation (text, reasoning, counts, timing)."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    finish_reason: FinishReason | None = None
    first_token_s: float | None = None

    def add(self, chunk: Any) -> None:
        """Fold one ``types.Chunk`` in."""
        if chunk.text_delta:
            self.text.append(chunk.text_delta)
        if chunk.reasoning_delta:
            self.reasoning.append(chunk.reasoning_delta)
        if (chunk.text_delta or chunk.reasoning_delta) and self.first_token_s is None:
            self.first_token_s = chunk.elapsed_s
        self.output_tokens = max(self.output_tokens, chunk.output_tokens)
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.cached_prompt_tokens is not None:
            self.cached_prompt_tokens = chunk.cached_prompt_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason

    def raw_text(self) -> str:
        """Return the full output, a server-split reasoning trace back in ``<think>`` tags."""
        text = "".join(self.text)
        if self.reasoning:
            return f"<think>\n{''.join(self.reasoning)}\n</think>\n\n{text}"
        return text


def finish(
    profile: ModelProfile,
    spec: QuerySpec,
    media: PreparedMedia,
    output: OutputAccumulator,
    timings: Timings | None = None,
) -> ReasonOutcome:
    """Parse the output and map its geometry to original-image pixels."""
    finish_reason = output.finish_reason or FinishReason.STOP
    server_reasoning = "".join(output.reasoning) if output.reasoning else None
    text = "".join(output.text) if server_reasoning is not None else output.raw_text()
    parsed = parsing.parse_output(
        text, reasoning=server_reasoning, finish_reason=finish_reason, task=spec.task
    )
    if server_reasoning is not None:  # keep the raw text complete for the result
        parsed = dataclasses.replace(parsed, raw_text=output.raw_text())
    problems: list[str] = []
    if media.views:  # each item in its own camera's pixels, named
        boxes, points, trajectories = geometry.map_answer_by_camera(
            parsed, {v.camera: v.geometry for v in media.views}, profile.coordinates, problems
        )
    else:
        boxes, points, trajectories = geometry.map_answer(
            parsed, media.geometry, profile.coordinates, problems
        )
    if problems:
        parsed = dataclasses.replace(parsed, problems=(*parsed.problems, *problems))
    tokens = TokenCounts(output.prompt_tokens, output.output_tokens, output.cached_prompt_tokens)
    return ReasonOutcome(parsed, boxes, points, trajectories, finish_reason, tokens,
                         timings or Timings())
