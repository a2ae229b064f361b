"""What the bench sends: modes, request shapes, pictures, per-device engine settings."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cosmos_reason_ros.bench import stats as benchstats

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL_MODES = ("engine", "node", "baseline", "floor", "concurrency", "second", "cameras",
             "ingest", "memory", "prefill", "lifting", "planning", "fleet")
# Measured side by side by the latency phase, request by request; every other mode is a phase.
LATENCY_MODES = ("engine", "node", "baseline", "floor")
# Run unless --modes says otherwise. Not fleet: it starts two more servers, two routers and
# 2N nodes of its own (minutes on CPU), so it runs only when asked (--modes fleet).
DEFAULT_MODES = tuple(m for m in ALL_MODES if m != "fleet")
LENGTHS = {"short": 8, "128": 128, "512": 512}
PREFILL_BATCH = 8  # concurrent goals for the prefill mode's throughput check
# The prefill mode's settings: (prefill.enabled, prefill.ready_frame_within_s).
PREFILL_SETTINGS = {"off": (False, 0.0), "on": (True, 0.0), "on+ready": (True, 0.3)}
PROMPT = "Describe what you see in the image."
PROMPT_2 = "Which objects are in the image, and where are they?"
SERVED_NAME = "bench"
NODE_ACTION = "/cosmos_reason/reason"
NODE_TOPIC = "/bench/image"
# The cameras mode's node names two cameras; the default (first) one keeps NODE_TOPIC, so the
# other modes' goals (empty cameras[]) ask about the same frames as on a one-camera node.
CAMERA_NAMES = ("front", "wrist")
WRIST_TOPIC = "/bench/wrist/image"
CAMERAS_FRONT_SIZE = (640, 480)  # when among --sizes; else the first size. Wrist: half of it.
# On the CPU, an engine's worker process keeps polling vLLM's shared-memory queue for 1 s after
# its last step (vllm SpinCondition, busy_loop_s), pinned to the core the other engine's
# worker is pinned to (VLLM_CPU_OMP_THREADS_BIND=auto on 2 cores): a request to one side
# within that second of the other side's last step waited ~1 s (TTFTs 30 ms or 1 s, nothing
# between). The cameras phase waits this long after the other side's request.
CPU_SIDE_SWITCH_WAIT_S = 1.2
BASELINE_TOPIC = "/bench/image_baseline"
BASELINE_NS = "/bench_baseline"
PHASE_WEIGHTS = (benchstats.Slice("latency", 45), benchstats.Slice("concurrency", 15),
                 benchstats.Slice("second", 8), benchstats.Slice("cameras", 5),
                 benchstats.Slice("ingest", 10),
                 benchstats.Slice("memory", 17), benchstats.Slice("prefill", 5),
                 benchstats.Slice("lifting", 1), benchstats.Slice("planning", 4),
                 benchstats.Slice("fleet", 20))
# The fleet mode: robots per routing policy and their cameras' rate (the policies:
# bench/phases/fleet.POLICIES).
FLEET_ROBOTS = 4
FLEET_CAMERA_HZ = 5.0
# The fleet's two backends on CPU: vLLM CPU's default KV block (128 tokens) is longer than
# the tiny model's whole image, so nothing but full blocks could ever hit; 32-token blocks
# (as in test/servers.py) let an image fill several.
FLEET_CPU_SERVER_ARGS = {"block_size": 32}


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """Engine settings and sweep shape per device; every engine of a run gets the same."""

    preset: str
    engine: dict[str, Any]
    concurrency: tuple[int, ...]
    repeats: int
    time_budget_s: float
    modes: tuple[str, ...] = DEFAULT_MODES


DEVICES = {
    "cpu": DeviceDefaults(
        preset="cpu_demo",
        engine={"dtype": "float32", "max_model_len": 4096, "enforce_eager": True,
                "enable_prefix_caching": True, "kv_cache_memory_bytes": 256 * 1024 * 1024,
                "max_num_seqs": 16},
        concurrency=(1, 2, 4, 8), repeats=8, time_budget_s=2400.0),
    "gpu": DeviceDefaults(
        preset="x86_gpu",
        engine={"dtype": "bfloat16", "max_model_len": 8192, "gpu_memory_utilization": 0.25,
                "enable_prefix_caching": True, "enforce_eager": False, "max_num_seqs": 16},
        concurrency=(1, 2, 4, 8, 16), repeats=5, time_budget_s=450.0,
        # Ingest and memory are properties of the node's process, measured on the CPU run;
        # the GPU's few minutes go to latency, throughput and caching.
        modes=("engine", "node", "baseline", "floor", "concurrency", "second", "cameras",
               "prefill")),
}

# Engine settings the node and VllmLocalConfig know by name; anything else is passed through
# (node: engine.extra_args JSON, in-process: extra_engine_args, server: --flag).
NODE_ENGINE_KEYS = ("dtype", "max_model_len", "gpu_memory_utilization", "enable_prefix_caching",
                    "enforce_eager", "kv_cache_memory_bytes", "max_num_seqs",
                    "max_num_batched_tokens", "quantization")


def picture(width: int, height: int, seed: int) -> np.ndarray:
    """Draw a deterministic camera-like picture: gradients, a floor, blocks, mild noise."""
    rng = np.random.default_rng(seed)
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = np.linspace(40, 220, width, dtype=np.uint8)[None, :]
    img[..., 1] = np.linspace(60, 200, height, dtype=np.uint8)[:, None]
    img[..., 2] = (seed * 37) % 200 + 30
    img[int(height * 0.65):] //= 2
    for _ in range(6):
        w, h = int(rng.integers(width // 12, width // 4)), int(rng.integers(height // 12,
                                                                            height // 4))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        img[y:y + h, x:x + w] = rng.integers(0, 255, 3, dtype=np.uint8)
    noise = rng.integers(0, 8, (height // 8 + 1, width // 8 + 1, 1), dtype=np.uint8)
    img += np.repeat(np.repeat(noise, 8, 0), 8, 1)[:height, :width]
    return img


def parse_size(text: str) -> tuple[int, int]:
    """'1280x720' -> (1280, 720)."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or int(w) <= 0 or int(h) <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT, e.g. 1280x720")
    return int(w), int(h)


T = TypeVar("T")


def rotated(items: Sequence[T], k: int) -> list[T]:
    """``items`` starting at index ``k`` (modulo its length), wrapping around.

    The phases rotate which side or setting goes first from round to round, so none is always
    measured first (or right after another).
    """
    k %= len(items)
    return [*items[k:], *items[:k]]


def size_name(size: tuple[int, int]) -> str:
    """(1280, 720) -> '1280x720'."""
    return f"{size[0]}x{size[1]}"


def parse_engine_args(pairs: Sequence[str]) -> dict[str, Any]:
    """'k=v' pairs; values parsed as JSON where they parse (numbers, true/false, objects)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise SystemExit(f"--engine-arg {pair!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def engine_settings(device: str, overrides: dict[str, Any]) -> tuple[dict[str, Any],
                                                                     dict[str, Any]]:
    """Return (settings the node knows by name, pass-through extras) for every engine."""
    settings = dict(DEVICES[device].engine)
    extras: dict[str, Any] = {}
    for key, value in overrides.items():
        (settings if key in NODE_ENGINE_KEYS else extras)[key] = value
    return settings, extras
