"""The node's parameters: one table of names, defaults, descriptions and checks.

The table is plain data so that the config presets, the docs, the parameter descriptors and
the tests can all be checked against it, and it needs no ROS: offline replay validates its
preset with it. ``ros/config.py`` declares it on the node (the only part that touches
rclpy). Code reads the values as the typed, frozen ``core/params.NodeParams`` that
``validate`` returns (``params.limits.max_tokens``), generated from this table by
``scripts/gen_params.py``.

Every value is validated once at startup; a bad one raises ``ConfigError`` naming the
parameter, the value and what is allowed, and the node exits instead of running
half-configured. So does a parameter name the node does not have, and a parameters file none
of whose sections applies to the node (e.g. keyed ``cosmos_reason:`` while the node runs in a
namespace): the presets are keyed ``/**:`` so that they apply under any namespace and name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosmos_reason_ros.core import routing
from cosmos_reason_ros.core.cameras import MAX_CAMERAS, camera_name_problem
from cosmos_reason_ros.core.models import looks_like_local_path, missing_path_hint
from cosmos_reason_ros.core.params import EngineParams, NodeParams
from cosmos_reason_ros.core.prompts import DEFAULT_TASK
from cosmos_reason_ros.core.tasks import find_spec
from cosmos_reason_ros.engines.factory import ENGINE_KINDS, create_engine

# The key of every preset: applies to the node under any namespace and node name. ROS 2
# Humble's rclpy applies only '/**' and the node's exact fully qualified name from a
# parameters file (newer ones also other wildcards), so '/**' is the portable choice.
PRESET_KEY = "/**"
DEFAULT_NODE_FQN = "/cosmos_reason"


class ConfigError(ValueError):
    """A parameter has a value the node cannot run with."""


@dataclass(frozen=True)
class Choice:
    """A string parameter's allowed values."""

    allowed: tuple[str, ...]

    def __call__(self, value: Any) -> str | None:
        """Return the problem with ``value``, or None if it is allowed."""
        return None if value in self.allowed else f"allowed: {self.describe()}"

    def describe(self) -> str:
        """Return the allowed values, as the docs and the parameter descriptor show them."""
        return ", ".join(self.allowed)


@dataclass(frozen=True)
class Range:
    """A number parameter's bounds (inclusive, except a ``low_open`` lower bound)."""

    low: float
    high: float = math.inf
    low_open: bool = False

    def __call__(self, value: Any) -> str | None:
        """Return the problem with ``value``, or None if it is inside the bounds."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        ok = (value > self.low if self.low_open else value >= self.low) and value <= self.high
        return None if ok else f"allowed: {self.describe()}"

    def describe(self) -> str:
        """Return the bounds in words, e.g. ``>= 0, <= 10``."""
        bound = f"{'>' if self.low_open else '>='} {self.low}"
        return bound + ("" if self.high == math.inf else f", <= {self.high}")


@dataclass(frozen=True)
class JsonObject:
    """A string parameter holding a JSON object (ROS parameters cannot hold mappings)."""

    def __call__(self, value: Any) -> str | None:
        """Return the problem with ``value``, or None if it is empty or a JSON object."""
        if value == "":
            return None
        try:
            parsed = json.loads(value)
        except ValueError as e:
            return f"must be a JSON object or empty ({e})"
        return None if isinstance(parsed, dict) else "must be a JSON object or empty"

    def describe(self) -> str:
        """Return what is allowed, in words."""
        return "JSON object or empty"


@dataclass(frozen=True)
class CameraNames:
    """A string list of camera names: each one ROS name token, none twice, at most 16."""

    def __call__(self, value: Any) -> str | None:
        """Return the problem with ``value``, or None if every name can name a camera."""
        for i, name in enumerate(value):
            problem = camera_name_problem(name)
            if problem:
                return f"[{i}]={name!r} {problem}"
            if name in value[:i]:
                return f"[{i}]={name!r} is listed twice; name each camera once"
        if len(value) > MAX_CAMERAS:
            return f"{len(value)} cameras; allowed at most {MAX_CAMERAS} (images per request)"
        return None

    def describe(self) -> str:
        """Return what is allowed, in words."""
        return (f"up to {MAX_CAMERAS} unique names, each a letter then letters, digits or "
                f"underscores")


@dataclass(frozen=True)
class ChoiceList:
    """A string list whose every item is one of ``allowed``."""

    allowed: tuple[str, ...]

    def __call__(self, value: Any) -> str | None:
        """Return the problem with the first item not allowed, or None."""
        for i, item in enumerate(value):
            if item not in self.allowed:
                return f"[{i}]={item!r}: allowed: {self.describe()}"
        return None

    def describe(self) -> str:
        """Return the allowed items."""
        return "each item one of " + ", ".join(self.allowed)


@dataclass(frozen=True)
class TextRule:
    """A string (or string list) checked by a function of the layer that uses the value.

    ``problem`` returns what is wrong, or None; ``words`` say what is allowed. The function
    is the one copy the consumer also applies (e.g. ``core/routing.base_url_problem`` for
    ``engine.url`` and the engine's own config).
    """

    problem: Callable[[Any], str | None]
    words: str

    def __call__(self, value: Any) -> str | None:
        """Return the problem with ``value``, or None if it is allowed."""
        return self.problem(value)

    def describe(self) -> str:
        """Return what is allowed, in words."""
        return self.words


Check = Choice | Range | JsonObject | CameraNames | ChoiceList | TextRule

# Parameters that no longer exist -> what replaced them (named in the unknown-name error).
RENAMED = {
    "engine.endpoints": "engine.url (the server or router) plus engine.fallback_urls "
                        "(ordered, used while it is unreachable); load balancing belongs "
                        "to the router (docs/DEPLOYMENT.md)",
    "lifecycle.enabled": "lifecycle.autostart (false: wait for a lifecycle manager)",
}


@dataclass(frozen=True)
class Param:
    """One declared parameter."""

    name: str
    default: Any
    description: str
    check: Check | None = None  # callable: returns a problem, or None if fine
    runtime: bool = False  # may be set while the node runs (all others are read-only)

    @property
    def allowed(self) -> str:
        """What the check allows, in words ("" when any value of the type is fine)."""
        return self.check.describe() if self.check is not None else ""


def _choice(*allowed: str) -> Choice:
    return Choice(allowed)


def _range(low: float, high: float = math.inf, *, low_open: bool = False) -> Range:
    return Range(low, high, low_open)


_json_object = JsonObject()


# Defaults in one place; config/*.yaml presets override them. After a change, run
# python scripts/gen_params.py (core/params.py and docs/PARAMETERS.md come from this table).
PARAMS: tuple[Param, ...] = (
    # --- engine.* ------------------------------------------------------------------------
    Param("engine.kind", "vllm", "Inference backend: 'vllm' (in-process AsyncLLM) or 'openai' "
          "(OpenAI-compatible server such as vllm serve).", _choice(*ENGINE_KINDS)),
    Param("engine.model", "", "Checkpoint directory or hub name (vllm), or the served model name "
          "(openai; empty = ask the server)."),
    Param("engine.served_model_name", "", "Name reported in results (empty = model dir name)."),
    Param("engine.dtype", "auto", "Weights dtype for vllm (auto, bfloat16, float16, float32).",
          _choice("auto", "bfloat16", "float16", "float32", "half", "float")),
    Param("engine.max_model_len", 8192, "Context length in tokens (prompt + image + output).",
          _range(256)),
    Param("engine.gpu_memory_utilization", 0.9, "Fraction of GPU memory vLLM may use.",
          _range(0.0, 1.0, low_open=True)),
    Param("engine.enable_prefix_caching", True, "Reuse cached prompt/vision blocks across "
          "questions about the same frame."),
    Param("engine.enforce_eager", False, "Disable CUDA graphs / compilation (faster start, "
          "slower decode; needed on small Jetsons)."),
    Param("engine.quantization", "", "vLLM quantization method (empty = from the checkpoint)."),
    Param("engine.limit_mm_per_prompt", '{"image": 1, "video": 1}', "Media items per prompt "
          "(JSON object).", _json_object),
    Param("engine.mm_processor_kwargs", "", "Extra processor arguments (JSON object).",
          _json_object),
    Param("engine.mm_processor_cache_gb", 0.5, "GiB of processed images vLLM keeps for reuse "
          "(second questions, prefilled frames), in the node process and again in the engine "
          "core; vLLM's own default of 4 grows RSS by gigabytes on a camera stream.",
          _range(0, 64)),
    Param("engine.structured_outputs_backend", "guidance", "Constrained-decoding backend for "
          "JSON schemas (guidance, xgrammar, outlines, auto).",
          _choice("guidance", "xgrammar", "outlines", "auto")),
    Param("engine.max_num_seqs", 0, "Max sequences batched together (0 = vLLM default).",
          _range(0)),
    Param("engine.max_num_batched_tokens", 0, "Max tokens per scheduler step (0 = default).",
          _range(0)),
    Param("engine.kv_cache_memory_bytes", 0, "KV cache size in bytes (0 = from memory "
          "utilization).", _range(0)),
    Param("engine.extra_args", "", "Further vLLM engine arguments, passed through (JSON "
          "object, e.g. {\"max_num_partial_prefills\": 2}).", _json_object),
    Param("engine.warmup_width", 640, "Width of the warm-up image (use the camera's).",
          _range(16, 8192)),
    Param("engine.warmup_height", 480, "Height of the warm-up image.", _range(16, 8192)),
    Param("engine.freeze_heap", True, "After startup, move every object that exists then "
          "(engine config, tokenizer, processor) out of Python's garbage collector's view "
          "(gc.freeze), so full collections, which stop every thread of the node, walk only "
          "what goals create. Pauses since startup are in diagnostics (gc_*)."),
    Param("engine.url", "http://127.0.0.1:8000/v1", "openai: base URL of the server, or of "
          "the router in front of several (vllm-router); requests go here while it answers.",
          TextRule(routing.base_url_problem, routing.URL_RULE)),
    Param("engine.fallback_urls", [], "openai: base URLs tried in this order while "
          "engine.url is unreachable (e.g. the robot's onboard server); requests return to "
          "engine.url as soon as its /health answers.",
          TextRule(routing.fallback_urls_problem, f"up to {routing.MAX_FALLBACK_URLS} distinct "
                   f"URLs, each {routing.URL_RULE}")),
    Param("engine.session_header", routing.DEFAULT_SESSION_HEADER, "openai: routing header "
          "sent with every request, so that a router with session affinity (vllm-router "
          "--policy consistent_hash) sends one camera's requests to one server ('' = none).",
          TextRule(routing.header_name_problem, routing.HEADER_RULE)),
    Param("engine.session_key", "", "openai: prefix of the routing key; requests about a "
          "camera carry '<prefix>/<camera>'. Empty = the node's fully qualified name "
          "(/<namespace>/<node>): set a unique name (e.g. the robot's) when robots share one.",
          TextRule(routing.session_key_problem, routing.SESSION_KEY_RULE)),
    Param("engine.api_key_env", "", "openai: NAME of the environment variable holding the API "
          "key (the key itself is never a parameter and never logged)."),
    Param("engine.connect_timeout_s", 3.0, "openai: TCP connect timeout.", _range(0.1, 600)),
    Param("engine.read_timeout_s", 30.0, "openai: max silence between streamed chunks.",
          _range(0.1, 3600)),
    Param("engine.start_timeout_s", 600.0, "Max time to load and warm up the engine.",
          _range(1, 7200)),
    Param("engine.shutdown_timeout_s", 2.0, "vllm: how long the engine process may take to "
          "exit on shutdown before it is killed.", _range(0, 600)),
    Param("engine.constrains_after_reasoning", False, "The engine applies JSON schemas only "
          "after </think> (server started with --reasoning-parser); otherwise schemas are "
          "skipped for reasoning goals."),
    # --- model.* -------------------------------------------------------------------------
    Param("model.family", "auto", "Prompt/coordinate conventions: auto (from config.json), "
          "cosmos_reason2, cosmos_reason1, qwen3_vl, qwen2_5_vl.",
          _choice("auto", "cosmos_reason2", "cosmos_reason1", "qwen3_vl", "qwen2_5_vl")),
    Param("model.max_pixels", 0, "Image pixel budget sent to the model (0 = the family "
          "default, e.g. 1024 visual tokens for Cosmos-Reason2).", _range(0)),
    Param("model.constrain_structured_tasks", True, "Constrain ground/point/trajectory/verify/"
          "temporal answers with their JSON schema."),
    # --- image.* -------------------------------------------------------------------------
    Param("image.input", "raw", "Camera input: raw (image), compressed (image/compressed) or "
          "both.", _choice("raw", "compressed", "both")),
    Param("image.qos_depth", 1, "Camera subscription queue depth.", _range(1, 100)),
    Param("image.qos_reliability", "auto", "Camera QoS reliability: auto follows the "
          "publishers (reliable unless one is best effort), as ros2 topic echo does.",
          _choice("auto", "best_effort", "reliable")),
    Param("image.history_frames", 64, "Frames kept for clips and 'next'.", _range(1, 10000)),
    Param("image.history_mb", 512.0, "Memory bound of the frame history (MB).",
          _range(1, 65536)),
    Param("image.max_age_s", 2.0, "Default max age of the latest frame (0 = any age).",
          _range(0)),
    Param("image.wait_s", 2.0, "Default wait for a frame ('next', or none received yet).",
          _range(0, 600)),
    Param("image.max_pixels", 50_000_000, "Largest image accepted (declared width x height).",
          _range(1)),
    Param("image.clip_duration_s", 3.0, "Default clip length for SOURCE_CLIP.",
          _range(0.1, 600)),
    Param("image.clip_fps", 4.0, "Default clip sampling rate (the models' training rate).",
          _range(0.1, 60)),
    Param("image.clip_min_fps", 0.0, "Fail a clip (NO_IMAGE) whose history gives fewer frames "
          "per second than this (0 = never; the result's clip_fps reports the rate).",
          _range(0, 60)),
    # --- cameras.* (several named cameras) ---------------------------------------------
    # ROS 2 parameters are flat typed values (no per-name maps). Per-camera settings are
    # string lists parallel to cameras.names rather than names declared on the fly
    # (cameras.<name>.input, as Nav2 does for plugins): those would escape this table, so the
    # typed NodeParams, the unknown-name check, the presets' validation and the generated docs
    # would not know them; a list is one typed, checked parameter that '/**' presets and
    # `-p` set alike. Only the input kind differs per camera: each camera gets the image.*
    # QoS (best effort connects to every driver) and its own history with the image.* bounds.
    Param("cameras.names", [], "Named cameras, the default camera first (a goal with empty "
          "cameras[] asks about it). Camera NAME subscribes to NAME/image and/or "
          "NAME/image/compressed (the first camera, with depth.enabled, also to "
          "NAME/depth/image and NAME/camera_info): relative names, remapped to the drivers' "
          "topics. Empty = one camera named 'default' on image, image/compressed. Left at its "
          "default, engine.limit_mm_per_prompt takes one image per camera.", CameraNames()),
    Param("cameras.inputs", [], "Per camera, in cameras.names order: raw, compressed or both "
          "(empty = image.input for every camera).", ChoiceList(("raw", "compressed", "both"))),
    Param("cameras.max_skew_s", 0.1, "Largest difference between the header stamps of the "
          "frames one multi-camera goal uses (0 = equal stamps: hardware-synchronised "
          "cameras); the goal waits, at most its wait_for_image_s, for such a set.",
          _range(0.0, 10.0)),
    # --- depth.* (3D lifting) --------------------------------------------------------------
    Param("depth.enabled", False, "Lift boxes, points and trajectories to 3D with a depth image "
          "registered to the colour image (depth/image) and the colour CameraInfo "
          "(camera_info)."),
    Param("depth.scale", 0.0, "Metres per depth unit (0 = the encoding's own: 16UC1 mm, "
          "32FC1 m).", _range(0.0, 1000.0)),
    Param("depth.min_m", 0.1, "Nearer depth is invalid.", _range(0.0, 1000.0)),
    Param("depth.max_m", 10.0, "Farther depth is invalid.", _range(0.0, 1000.0, low_open=True)),
    Param("depth.max_skew_s", 0.05, "Largest stamp difference between the colour frame and "
          "the depth frame used.", _range(0.0, 10.0)),
    Param("depth.history_frames", 30, "Depth frames kept to match colour stamps.",
          _range(1, 1000)),
    Param("depth.registered_frame_id", "", "A depth frame_id accepted as registered to the "
          "colour image besides the colour frame_id itself."),
    Param("depth.rectified", False, "The colour topic is rectified (image_rect*): "
          "intrinsics from CameraInfo.p, distortion ignored (else k; non-zero distortion is "
          "warned about once)."),
    Param("depth.target_frame", "", "Frame for 3D positions via tf2_ros at the image stamp "
          "(empty = the camera's optical frame)."),
    Param("depth.tf_timeout_s", 0.1, "Longest wait for the target_frame transform.",
          _range(0.0, 10.0)),
    # --- limits.* ------------------------------------------------------------------------
    Param("limits.max_concurrent_goals", 8, "Goals generating at once.", _range(1, 256)),
    Param("limits.max_queued_goals", 16, "Goals waiting for a slot; beyond this, OVERLOADED.",
          _range(0, 1024)),
    Param("limits.max_tokens", 4096, "Cap on a goal's max_tokens.", _range(1, 1_000_000)),
    Param("limits.goal_timeout_s", 120.0, "Default time limit per goal.", _range(0.1, 86400)),
    Param("limits.max_prompt_chars", 4000, "Longest prompt accepted.", _range(1, 1_000_000)),
    Param("limits.max_schema_bytes", 16384, "Largest response_schema accepted.",
          _range(2, 10_000_000)),
    Param("limits.max_clip_frames", 32, "Most frames sent for one clip.", _range(1, 1024)),
    Param("limits.max_clip_duration_s", 60.0, "Longest clip a goal may ask for.",
          _range(0.1, 3600)),
    Param("limits.fixed_output_length", False, "Benchmarks only: every goal generates exactly "
          "its max_tokens (end-of-sequence ignored), so output lengths are comparable."),
    Param("limits.feedback_rate_hz", 10.0, "Max feedback messages per second per goal.",
          _range(0.1, 1000)),
    Param("limits.feedback_total_rate_hz", 50.0, "Max text feedback messages per second over "
          "all generating goals together: with many goals each gets a share (never more than "
          "feedback_rate_hz). Bounds what every action client must decode: all goals share "
          "one feedback topic.", _range(1.0, 10000)),
    Param("limits.result_keep_s", 10, "Seconds a finished goal's result stays available to "
          "late result requests. Every finished goal kept is repeated in each action status "
          "message, which every action client decodes (ROS 2 Humble/Jazzy keep 900 s).",
          _range(1, 3600)),
    # --- periodic.* ----------------------------------------------------------------------
    Param("periodic.enabled", False, "Run periodic.prompt on the latest frame every period_s "
          "and publish on ~/results (skipped while busy; goals take priority)."),
    Param("periodic.period_s", 5.0, "Seconds between periodic runs.", _range(0.1, 86400)),
    Param("periodic.prompt", "", "The periodic question (e.g. 'Is the aisle blocked?')."),
    Param("periodic.task", "", "Task template for periodic runs (empty = vqa)."),
    Param("periodic.targets", "", "Comma-separated targets for periodic ground/point runs."),
    Param("periodic.max_tokens", 256, "Output token limit of a periodic run.",
          _range(1, 1_000_000)),
    # --- prefill.* ----------------------------------------------------------------------
    Param("prefill.enabled", False, "Speculatively prefill the newest frame (system prompt + "
          "image tokens, one output token) so goals about it hit the engine's prefix cache. "
          "Settable at runtime. Needs engine.enable_prefix_caching (or a server with prefix "
          "caching); off on single-sequence engines.", runtime=True),
    Param("prefill.period_s", 0.2, "At most one prefill per this many seconds (the newest "
          "frame at that moment; unchanged frames are not prefilled again).",
          _range(0.01, 3600)),
    Param("prefill.skip_while_busy", True, "Start no prefill while goals or a periodic run are "
          "running or queued (a running prefill of another frame is always aborted when a "
          "goal needs the engine)."),
    Param("prefill.ready_frame_within_s", 0.0, "A goal on the latest frame uses the newest "
          "already-prefilled frame instead when the newest frame is not prefilled yet and at "
          "most this much newer (by stamp): a slightly older frame, answered from the prefix "
          "cache, rather than waiting for or redoing the image prefill. The result's header "
          "names the frame used. 0 = always the newest frame. Settable at runtime.",
          _range(0, 10), runtime=True),
    Param("prefill.reasoning", False, "Prefill the prefix of goals with reasoning on (differs "
          "only for Cosmos-Reason1 / Qwen2.5-VL, whose system prompt changes with it)."),
    # --- diagnostics.* -------------------------------------------------------------------
    Param("diagnostics.period_s", 1.0, "Seconds between /diagnostics messages.",
          _range(0.1, 60)),
    Param("diagnostics.camera_warn_s", 2.0, "WARN when no frame arrived for this long.",
          _range(0)),
    Param("diagnostics.camera_error_s", 10.0, "ERROR when no frame arrived for this long.",
          _range(0)),
    # --- lifecycle.* --------------------------------------------------------------------
    Param("lifecycle.autostart", True, "Configure and activate at start. False: the node "
          "waits unconfigured for a lifecycle manager (docs/INTERFACES.md, \"Lifecycle\"), "
          "and a bad parameter fails configure instead of the start."),
    Param("lifecycle.deactivate_goals", "finish", "What deactivate does with accepted goals: "
          "'finish' lets them end on their own (those still running after "
          "deactivate_timeout_s are stopped), 'cancel' stops them at once (ABORTED, "
          "ENGINE_UNAVAILABLE 'node deactivating ...').", _choice("finish", "cancel")),
    Param("lifecycle.deactivate_timeout_s", 10.0, "Longest wait of deactivate for accepted "
          "goals to end.", _range(0.0, 3600)),
)

PARAMS_BY_NAME = {p.name: p for p in PARAMS}
RUNTIME_PARAMS = tuple(p.name for p in PARAMS if p.runtime)


def same_type(default: Any, value: Any) -> bool:
    """Whether ``value`` has the type of ``default`` (an int serves for a double)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


def _model_problem(model: str) -> str | None:
    """Why the vllm engine cannot load ``model``: empty, or a local path that does not exist.

    A hub id (``org/name``) is left to vLLM; a value that looks like a path (``/models/x``,
    ``./x``, ``~/x``) must be a directory, or the node would fail later with a message about
    the model family or the hub instead of the path.
    """
    if not model:
        return "engine.model='': the vllm engine needs a checkpoint directory or name"
    if not looks_like_local_path(model):
        return None
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isdir(path):
        return None
    if os.path.exists(path):
        return f"engine.model={model!r}: {path} is a file, not a checkpoint directory"
    return (f"engine.model={model!r}: no such directory {path} (looked for a checkpoint "
            f"directory there; {missing_path_hint(path)}); give an existing checkpoint "
            f"directory or a hub model id such as nvidia/Cosmos-Reason2-2B")


def validate(values: Mapping[str, Any]) -> NodeParams:
    """Check every value against its parameter; return the complete, typed ``NodeParams``.

    Unknown names are errors (a typo in a preset must not be silently ignored). Values not
    given take the table's defaults; a runtime change validates the whole set again
    (``validate({**params.to_values(), **changes})``).
    """
    unknown = sorted(set(values) - set(PARAMS_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown parameter(s): {', '.join(unknown)}{renamed_hint(unknown)}")
    result: dict[str, Any] = {}
    problems: list[str] = []
    for param in PARAMS:
        value = values.get(param.name, param.default)
        if isinstance(param.default, list) and value is None:
            value = []  # a YAML '[]' has no element type: rclpy hands it over unset (None)
        if not same_type(param.default, value):
            problems.append(f"{param.name}={value!r}: expected {type(param.default).__name__}")
            continue
        if isinstance(param.default, float):
            value = float(value)
        if isinstance(param.default, list):
            value = list(value)
        problem = param.check(value) if param.check else None
        if problem:
            problems.append(f"{param.name}={value!r}: {problem}")
        result[param.name] = value
    if problems:
        raise ConfigError("invalid parameters: " + "; ".join(problems))
    params = NodeParams.from_values(result)
    problem = _combination_problem(params)
    if problem:
        raise ConfigError("invalid parameters: " + problem)
    return _with_camera_image_limit(params)


def renamed_hint(unknown: Sequence[str]) -> str:
    """Name what replaced the unknown parameters that once existed ("" for the others)."""
    return "".join(f"; {name} was replaced by {RENAMED[name]}" for name in unknown
                   if name in RENAMED)


def _combination_problem(p: NodeParams) -> str | None:
    """Return the first problem of values that are each valid but not together, or None."""
    if p.engine.kind == "vllm":
        problem = _model_problem(p.engine.model)
        if problem:
            return problem
    if p.engine.kind == "openai" and routing.normalized_url(p.engine.url) in map(
            routing.normalized_url, p.engine.fallback_urls):
        return (f"engine.fallback_urls={list(p.engine.fallback_urls)!r}: repeats "
                f"engine.url={p.engine.url!r}; list other servers only")
    periodic_task = find_spec(p.periodic.task or DEFAULT_TASK.value)
    if p.periodic.enabled and not p.periodic.prompt.strip() \
            and periodic_task is not None and periodic_task.needs_prompt:
        return "periodic.prompt='': periodic.enabled needs a prompt for this task"
    if p.depth.max_m <= p.depth.min_m:
        return (f"depth.max_m={p.depth.max_m!r}: must be greater than "
                f"depth.min_m={p.depth.min_m!r}")
    return _cameras_problem(p)


def _cameras_problem(p: NodeParams) -> str | None:
    """Return what is wrong with the ``cameras.*`` values together, or None."""
    names, inputs = p.cameras.names, p.cameras.inputs
    if inputs and len(inputs) != len(names):
        return (f"cameras.inputs={list(inputs)!r}: has {len(inputs)} entries for "
                f"{len(names)} camera(s) in cameras.names={list(names)!r}; give one per "
                f"camera, in the same order, or leave it empty (image.input for all)")
    return None


def _with_camera_image_limit(p: NodeParams) -> NodeParams:
    """Let the engine take one image per camera when ``limit_mm_per_prompt`` is the default.

    vLLM refuses a prompt with more images than ``limit_mm_per_prompt`` allows, and the
    default allows one: with several cameras left at the default, the image count is raised to
    the number of cameras (the declared parameter shows the value the engine gets). A value
    the user set stays as set: a goal with more cameras than it allows is BAD_REQUEST.
    """
    cameras = len(p.cameras.names)
    default = json.loads(PARAMS_BY_NAME["engine.limit_mm_per_prompt"].default)
    limits = json.loads(p.engine.limit_mm_per_prompt or "{}")
    if cameras <= 1 or limits != default or limits.get("image", 0) >= cameras:
        return p
    limits["image"] = cameras
    return dataclasses.replace(p, engine=dataclasses.replace(
        p.engine, limit_mm_per_prompt=json.dumps(limits)))


def engine_options(e: EngineParams) -> dict[str, Any]:
    """Translate validated ``engine.*`` values into the chosen engine's config mapping."""
    if e.kind == "openai":
        return {
            "url": e.url,
            "fallback_urls": tuple(e.fallback_urls),
            "session_header": e.session_header,
            "model": e.model,
            "api_key_env": e.api_key_env,
            "connect_timeout_s": e.connect_timeout_s,
            "read_timeout_s": e.read_timeout_s,
            "start_timeout_s": e.start_timeout_s,
        }
    return {
        "model": e.model,
        "served_model_name": e.served_model_name,
        "dtype": e.dtype,
        "max_model_len": e.max_model_len,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "enable_prefix_caching": e.enable_prefix_caching,
        "enforce_eager": e.enforce_eager,
        "quantization": e.quantization or None,
        "limit_mm_per_prompt": json.loads(e.limit_mm_per_prompt),
        "mm_processor_kwargs": json.loads(e.mm_processor_kwargs) if e.mm_processor_kwargs
        else None,
        "mm_processor_cache_gb": e.mm_processor_cache_gb,
        "structured_outputs_backend": e.structured_outputs_backend,
        "max_num_seqs": e.max_num_seqs or None,
        "max_num_batched_tokens": e.max_num_batched_tokens or None,
        "kv_cache_memory_bytes": e.kv_cache_memory_bytes or None,
        "extra_engine_args": json.loads(e.extra_args) if e.extra_args else {},
        "warmup_image_width": e.warmup_width,
        "warmup_image_height": e.warmup_height,
        "shutdown_timeout_s": e.shutdown_timeout_s,
    }


def create_configured_engine(e: EngineParams) -> Any:
    """Build (not start) the engine ``engine.*`` describes, through ``engines/factory``.

    The engine's own config checks (e.g. ``api_key_env`` naming no variable) raise
    ``ConfigError``, as a bad parameter does.
    """
    try:
        return create_engine(e.kind, engine_options(e))
    except ValueError as err:
        raise ConfigError(f"invalid engine.* parameters: {err}") from err


def _flatten(prefix: str, tree: Mapping[str, Any], out: dict[str, Any]) -> None:
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            _flatten(name, value, out)
        else:
            out[name] = value


def yaml_sections(path: str) -> dict[str, dict[str, Any]]:
    """Read a ROS 2 parameters file into ``{node name: {flat parameter name: value}}``.

    Node names are as ROS reads them: nested keys above ``ros__parameters`` joined with '/',
    with a leading '/' (``cosmos_reason:`` is ``/cosmos_reason``; ``/**`` stays ``/**``).
    """
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"parameters file {path}: cannot read it ({e})") from e
    sections: dict[str, dict[str, Any]] = {}

    def walk(names: list[str], tree: Any) -> None:
        if not isinstance(tree, dict):
            return
        for key, value in tree.items():
            if key == "ros__parameters" and isinstance(value, dict):
                flat: dict[str, Any] = {}
                _flatten("", value, flat)
                node = "/" + "/".join(n.strip("/") for n in names if n.strip("/"))
                sections.setdefault(node, {}).update(flat)
            else:
                walk([*names, str(key)], value)

    walk([], doc)
    return sections


def section_applies(section: str, node_fqn: str) -> bool:
    """Whether a parameters-file section named ``section`` is meant for node ``node_fqn``.

    rcl's name matching: ``/**`` matches any number of name tokens, ``/*`` exactly one.
    (Humble's rclpy applies only ``/**`` and the exact name; ``declare_and_load`` notices
    when a section this matches did not reach the node.)
    """
    tokens = [t for t in section.split("/") if t]
    pattern = "".join("(/[A-Za-z0-9_~]+)*" if t == "**" else "(/[A-Za-z0-9_~]+)" if t == "*"
                      else "/" + re.escape(t) for t in tokens)
    return re.fullmatch(pattern or "/", node_fqn) is not None


def load_yaml_params(path: str, node_name: str = DEFAULT_NODE_FQN) -> dict[str, Any]:
    """Read what a ROS 2 parameters file sets for node ``node_name``, as flat names.

    As rclpy merges them: the ``/**`` section, then the node's own (``/cosmos_reason`` by
    default). Used by tests and tools to check presets without starting a node; the node
    itself gets its parameters from rclpy.
    """
    fqn = node_name if node_name.startswith("/") else f"/{node_name}"
    sections = yaml_sections(path)
    applied = [name for name in (PRESET_KEY, fqn) if name in sections]
    if not applied:
        raise ConfigError(f"{path}: no '{PRESET_KEY}:' (or '{fqn}:') section with "
                          f"ros__parameters")
    flat: dict[str, Any] = {}
    for name in applied:
        flat.update(sections[name])
    flat.pop("use_sim_time", None)
    return flat


def ros_params_files(argv: Sequence[str]) -> list[str]:
    """Return the ``--params-file`` arguments in the ``--ros-args`` parts of ``argv``."""
    files: list[str] = []
    in_ros_args = False
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--ros-args":
            in_ros_args = True
        elif arg == "--":
            in_ros_args = False
        elif in_ros_args and arg == "--params-file" and i + 1 < len(args):
            files.append(args[i + 1])
    return files


def check_params_files(files: Sequence[str], node_fqn: str,
                       overrides: Mapping[str, Any]) -> None:
    """Fail if a parameters file given to the node has no section that reached it.

    Without this a preset keyed by another node name or namespace (``cosmos_reason:`` for a
    node in ``/robot1``) is silently skipped and the node runs on code defaults. A section
    counts as applied when its name matches the node and its parameters are among the
    node's overrides (the last part catches wildcard sections an older rclpy ignores).
    """
    for path in files:
        sections = yaml_sections(path)
        applied = [name for name, values in sections.items()
                   if section_applies(name, node_fqn) and set(values) <= set(overrides)]
        if not applied:
            listed = ", ".join(f"'{name}'" for name in sections) or "none"
            raise ConfigError(
                f"parameters file {path} sets nothing for node {node_fqn}: none of its "
                f"sections ({listed}) applies to it, so the node would run on defaults; key "
                f"the file '{PRESET_KEY}:' (any namespace and node name) or '{node_fqn}:'")
