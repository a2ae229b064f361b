"""Data that crosses layers: requests, chunks, parsed answers, geometry, and the error hierarchy.

Everything here is a small frozen dataclass or an enum so that ``core``, ``engines`` and
``ros`` agree on one vocabulary without importing each other. Stamps are integer nanoseconds
(exact, like ``builtin_interfaces/Time``); durations are float seconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class ErrorCode(enum.IntEnum):
    """Outcome codes shared by every layer; the values equal the constants in Reason.action."""

    OK = 0
    NO_IMAGE = 1
    IMAGE_TOO_OLD = 2
    BAD_IMAGE = 3
    BAD_REQUEST = 4
    OVERLOADED = 5
    ENGINE_UNAVAILABLE = 6
    ENGINE_ERROR = 7
    TIMEOUT = 8
    CANCELLED = 9
    PROMPT_TOO_LONG = 10
    NOT_DELIVERED = 11  # set by the client: a goal or result reply was lost in transport


class CosmosReasonError(Exception):
    """Base of every error the package raises on purpose; ``code`` says which outcome it is."""

    code: ErrorCode = ErrorCode.ENGINE_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoImageError(CosmosReasonError):
    """No frame is available (none received yet, or none arrived within the wait)."""

    code = ErrorCode.NO_IMAGE


class ImageTooOldError(CosmosReasonError):
    """The newest frame is older than the goal allows."""

    code = ErrorCode.IMAGE_TOO_OLD


class BadImageError(CosmosReasonError):
    """An image buffer or file is malformed, unsupported or too large."""

    code = ErrorCode.BAD_IMAGE


class BadRequestError(CosmosReasonError):
    """A goal or request field is invalid (names the field, the value and what is allowed)."""

    code = ErrorCode.BAD_REQUEST


class OverloadedError(CosmosReasonError):
    """Concurrency and queue bounds are both full."""

    code = ErrorCode.OVERLOADED


class EngineUnavailableError(CosmosReasonError):
    """The engine cannot be reached or is not running (server down, engine dead)."""

    code = ErrorCode.ENGINE_UNAVAILABLE


class EngineError(CosmosReasonError):
    """The engine failed while serving a request (out of memory, internal error)."""

    code = ErrorCode.ENGINE_ERROR


class DeadlineExceededError(CosmosReasonError):
    """A request ran past its time limit."""

    code = ErrorCode.TIMEOUT


class RequestCancelledError(CosmosReasonError):
    """The request was cancelled by its caller."""

    code = ErrorCode.CANCELLED


class PromptTooLongError(CosmosReasonError):
    """Prompt plus media tokens exceed the engine's context length."""

    code = ErrorCode.PROMPT_TOO_LONG


class Task(str, enum.Enum):
    """Named prompt templates. ``VQA`` is the free-form question (the default).

    Each member is defined by its entry in ``core/tasks.py`` (checked at import).
    """

    VQA = "vqa"
    CAPTION = "caption"
    GROUND = "ground"
    POINT = "point"
    TRAJECTORY = "trajectory"
    NEXT_ACTION = "next_action"
    VERIFY = "verify"
    TEMPORAL = "temporal"
    COUNT = "count"


class CoordinateConvention(str, enum.Enum):
    """How a model family writes box and point coordinates."""

    NORMALIZED_1000 = "normalized_1000"  # Qwen3-VL / Cosmos-Reason2: 0-1000 per axis
    INPUT_PIXELS = "input_pixels"  # Qwen2.5-VL / Cosmos-Reason1: pixels of the resized input


class FinishReason(str, enum.Enum):
    """Why generation ended."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


# --- requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContentPart:
    """One piece of a chat turn: text, or a placeholder for the next image / the video.

    Images are referenced by order (the n-th ``image`` part is ``ChatRequest.images[n]``) so
    that pixel buffers never travel inside message structures.
    """

    kind: str  # "text" | "image" | "video"
    text: str = ""


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: str  # "system" | "user" | "assistant"
    content: tuple[ContentPart, ...]


@dataclass(frozen=True)
class Video:
    """A clip: RGB uint8 frames of one size, with their times relative to the first frame."""

    frames: tuple[np.ndarray, ...]
    timestamps_s: tuple[float, ...]
    fps: float


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; ``None`` leaves the engine's default."""

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    ignore_eos: bool = False  # benchmarks only: fixed output lengths


@dataclass(frozen=True)
class ChatRequest:
    """Everything an engine needs for one generation.

    ``images`` are RGB uint8 HxWx3 arrays already resized by the package to the model's pixel
    budget, so the engine's processor does not resize them again.
    """

    request_id: str
    messages: tuple[Message, ...]
    sampling: Sampling
    images: tuple[np.ndarray, ...] = ()
    video: Video | None = None
    json_schema: dict[str, Any] | None = None
    priority: int = 0  # lower runs first where the engine supports priorities
    # Whether the prompt asks for a <think> block: servers with a reasoning parser must then
    # let the model think (and constrain only after </think>); None = let the engine decide.
    reasoning: bool | None = None
    # Routing key for servers behind a router: every request about one camera carries the
    # same one, so they reach the server holding its prefix in cache ("" = none; the
    # in-process engine ignores it). See core/routing.py.
    session_key: str = ""

    def wants_reasoning(self) -> bool:
        """Whether the model should think first: the request's flag, else the prompt text.

        The Cosmos-Reason reasoning formats (Reason2: in the user text; Reason1: in the
        system prompt) both spell out the ``<think>`` tag; plain prompts never do.
        """
        if self.reasoning is not None:
            return bool(self.reasoning)
        return any("<think>" in part.text for message in self.messages
                   for part in message.content if part.kind == "text")


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of a generation.

    ``text_delta`` is new answer text (for in-process engines the raw model output, reasoning
    tags included); ``reasoning_delta`` is filled only by servers that split reasoning
    themselves. ``output_tokens`` is cumulative. The last chunk has ``finish_reason`` set and,
    where the engine reports them, prompt and cached-prompt token counts.
    """

    text_delta: str = ""
    reasoning_delta: str = ""
    output_tokens: int = 0
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    elapsed_s: float = 0.0  # since the engine accepted the request


# --- answers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """An axis-aligned box; coordinates are in whatever space the producer documents."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float
    label: str = ""
    score: float | None = None
    degenerate: bool = False  # zero area after clamping / fixing
    # The camera whose image holds it: as the model wrote it in a parsed answer, the camera's
    # name once mapped to pixels; "" when the request had no named camera (the goal's image).
    camera: str = ""


@dataclass(frozen=True)
class Point:
    """A 2D point."""

    x: float
    y: float
    label: str = ""
    camera: str = ""  # as ``Box.camera``


@dataclass(frozen=True)
class Trajectory:
    """An ordered list of points (e.g. an end-effector path), all in one camera's image."""

    points: tuple[Point, ...]
    label: str = ""
    camera: str = ""  # as ``Box.camera``


@dataclass(frozen=True)
class TemporalSpan:
    """An event in a clip, in seconds from the clip start."""

    start_s: float
    end_s: float
    caption: str = ""


@dataclass(frozen=True)
class ParsedAnswer:
    """What the parser found in one model output. Coordinates are still model coordinates.

    ``found`` names what was parsed (e.g. ``("json", "boxes")``); ``problems`` says, in words,
    what could not be parsed. Parsing never raises.
    """

    raw_text: str
    reasoning: str
    answer: str
    answer_json: str | None = None  # normalized (compact, UTF-8) JSON of the answer, if any
    boxes: tuple[Box, ...] = ()
    points: tuple[Point, ...] = ()
    trajectories: tuple[Trajectory, ...] = ()
    spans: tuple[TemporalSpan, ...] = ()
    truncated: bool = False
    found: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageGeometry:
    """Sizes needed to map model coordinates back to the original image.

    ``original_*`` is the image as received; ``input_*`` is what the model saw after the
    package's own resize (already a multiple of the model's patch unit, so the processor keeps
    it as is).
    """

    original_width: int
    original_height: int
    input_width: int
    input_height: int


@dataclass(frozen=True)
class Timings:
    """Where a goal's time went, in seconds."""

    queue_s: float = 0.0
    preprocess_s: float = 0.0
    time_to_first_token_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class TokenCounts:
    """Token accounting for one generation."""

    prompt: int = 0
    output: int = 0
    cached_prompt: int = 0


@dataclass(frozen=True)
class ReasonOutcome:
    """The core-level result of one query, before conversion to ROS messages."""

    parsed: ParsedAnswer
    boxes: tuple[Box, ...] = ()  # original-image pixels
    points: tuple[Point, ...] = ()  # original-image pixels
    trajectories: tuple[Trajectory, ...] = ()  # original-image pixels
    finish_reason: FinishReason = FinishReason.STOP
    tokens: TokenCounts = field(default_factory=TokenCounts)
    timings: Timings = field(default_factory=Timings)
