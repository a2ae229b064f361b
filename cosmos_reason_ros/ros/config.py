"""The node's parameters: one table of names, defaults, descriptions and checks.

The table is plain data so that the config presets, the docs and the tests can all be checked
against it; ``declare_and_load`` is the only part that touches rclpy. Every value is validated
once at startup; a bad one raises ``ConfigError`` naming the parameter, the value and what is
allowed, and the node exits instead of running half-configured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A parameter has a value the node cannot run with."""


@dataclass(frozen=True)
class Param:
    """One declared parameter."""

    name: str
    default: Any
    description: str
    check: Callable[[Any], str | None] | None = None  # returns a problem, or None if fine
    runtime: bool = False  # may be set while the node runs (all others are read-only)


def _choice(*allowed: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in allowed else f"allowed: {', '.join(allowed)}"


def _range(low: float, high: float = math.inf, *, low_open: bool = False
           ) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, float) and not math.isfinite(v):
            return "must be a finite number"
        ok = (v > low if low_open else v >= low) and v <= high
        bound = f"{'>' if low_open else '>='} {low}" + ("" if high == math.inf else f", <= {high}")
        return None if ok else f"allowed: {bound}"
    return check


def _json_object(v: Any) -> str | None:
    if v == "":
        return None
    try:
        parsed = json.loads(v)
    except ValueError as e:
        return f"must be a JSON object or empty ({e})"
    return None if isinstance(parsed, dict) else "must be a JSON object or empty"


# Defaults in one place; config/*.yaml presets override them. Keep docs/PARAMETERS.md in step.
PARAMS: tuple[Param, ...] = (
    # --- engine.* ------------------------------------------------------------------------
    Param("engine.kind", "vllm", "Inference backend: 'vllm' (in-process AsyncLLM) or 'openai' "
          "(OpenAI-compatible server such as vllm serve).", _choice("vllm", "openai")),
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
    Param("engine.endpoints", ["http://127.0.0.1:8000/v1"], "openai: base URLs of the servers "
          "(several = least-busy selection with failover)."),
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
    Param("image.qos_reliability", "best_effort", "Camera QoS reliability.",
          _choice("best_effort", "reliable")),
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
)

PARAMS_BY_NAME = {p.name: p for p in PARAMS}
RUNTIME_PARAMS = tuple(p.name for p in PARAMS if p.runtime)


def _same_type(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return isinstance(value, type(default))


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check every value against its parameter; return the complete, typed mapping.

    Unknown names are errors (a typo in a preset must not be silently ignored).
    """
    unknown = sorted(set(values) - set(PARAMS_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown parameter(s): {', '.join(unknown)}")
    result: dict[str, Any] = {}
    problems: list[str] = []
    for param in PARAMS:
        value = values.get(param.name, param.default)
        if not _same_type(param.default, value):
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
    if not problems and result["engine.kind"] == "vllm" and not result["engine.model"]:
        problems.append("engine.model='': the vllm engine needs a checkpoint directory or name")
    if not problems and result["engine.kind"] == "openai" and not result["engine.endpoints"]:
        problems.append("engine.endpoints=[]: the openai engine needs at least one URL")
    if not problems and result["periodic.enabled"] and not result["periodic.prompt"].strip() \
            and result["periodic.task"] in ("", "vqa", "verify", "trajectory"):
        problems.append("periodic.prompt='': periodic.enabled needs a prompt for this task")
    if problems:
        raise ConfigError("invalid parameters: " + "; ".join(problems))
    return result


def engine_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Translate validated ``engine.*`` values into the chosen engine's config mapping."""
    if values["engine.kind"] == "openai":
        return {
            "endpoints": tuple(values["engine.endpoints"]),
            "model": values["engine.model"],
            "api_key_env": values["engine.api_key_env"],
            "connect_timeout_s": values["engine.connect_timeout_s"],
            "read_timeout_s": values["engine.read_timeout_s"],
            "start_timeout_s": values["engine.start_timeout_s"],
        }
    extra = json.loads(values["engine.extra_args"]) if values["engine.extra_args"] else {}
    mm_kwargs = values["engine.mm_processor_kwargs"]
    return {
        "model": values["engine.model"],
        "served_model_name": values["engine.served_model_name"],
        "dtype": values["engine.dtype"],
        "max_model_len": values["engine.max_model_len"],
        "gpu_memory_utilization": values["engine.gpu_memory_utilization"],
        "enable_prefix_caching": values["engine.enable_prefix_caching"],
        "enforce_eager": values["engine.enforce_eager"],
        "quantization": values["engine.quantization"] or None,
        "limit_mm_per_prompt": json.loads(values["engine.limit_mm_per_prompt"]),
        "mm_processor_kwargs": json.loads(mm_kwargs) if mm_kwargs else None,
        "mm_processor_cache_gb": values["engine.mm_processor_cache_gb"],
        "structured_outputs_backend": values["engine.structured_outputs_backend"],
        "max_num_seqs": values["engine.max_num_seqs"] or None,
        "max_num_batched_tokens": values["engine.max_num_batched_tokens"] or None,
        "kv_cache_memory_bytes": values["engine.kv_cache_memory_bytes"] or None,
        "extra_engine_args": extra,
        "warmup_image_width": values["engine.warmup_width"],
        "warmup_image_height": values["engine.warmup_height"],
        "shutdown_timeout_s": values["engine.shutdown_timeout_s"],
    }


def load_yaml_params(path: str, node_name: str = "cosmos_reason") -> dict[str, Any]:
    """Read a ROS 2 parameter file (``node: ros__parameters: {...}``) into flat names.

    Used by tests and tools to check presets without starting a node; the node itself gets
    its parameters from rclpy.
    """
    import yaml

    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f) or {}
    section = doc.get(node_name) or doc.get("/**") or doc.get(f"/{node_name}")
    if not isinstance(section, dict) or "ros__parameters" not in section:
        raise ConfigError(f"{path}: no '{node_name}: ros__parameters:' (or '/**') section")
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict):
                walk(name, value)
            else:
                flat[name] = value

    walk("", section["ros__parameters"])
    flat.pop("use_sim_time", None)
    return flat


def declare_and_load(node: Any) -> dict[str, Any]:
    """Declare every parameter on ``node`` (with descriptions) and return validated values."""
    from rcl_interfaces.msg import ParameterDescriptor

    values: dict[str, Any] = {}
    for param in PARAMS:
        descriptor = ParameterDescriptor(description=param.description,
                                         read_only=not param.runtime, dynamic_typing=True)
        default = param.default
        declared = node.declare_parameter(param.name, default, descriptor)
        values[param.name] = declared.value
    return validate(values)
