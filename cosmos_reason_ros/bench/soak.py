"""Soak: a camera at 10 Hz, periodic and goal-driven queries for N minutes, resources over time.

    soak --duration-s 600                       # tiny model on the CPU preset, 10 minutes
    soak --model /models/Cosmos-Reason2-2B --preset x86_gpu --duration-s 3600
    soak --connect --node-pid 1234              # a node that is already running
    soak --duration-s 60 --goal-period-s 0 --periodic-s 0 --probe   # where frames are lost

Subscribes to ``~/results`` and ``/diagnostics`` first, then starts the node (or connects to
one), publishes synthetic frames at ``--camera-hz`` (raw or JPEG, best effort or reliable),
turns periodic monitoring on (``--periodic-s``; 0 = off), sends a goal every
``--goal-period-s`` (0 = none) without waiting for the previous one, and samples the node
process (RSS of the node and its children, such as vLLM's engine core; open file
descriptors; threads) once a second. At the end it waits for outstanding results, then holds
the node with a goal (no periodic run starts while a goal is in the node) until its status
shows no periodic run in progress: that status's count is final and must equal the periodic
results received. ``--probe`` adds a second camera reader with the node's QoS and its DDS
sample-lost count, to tell frames DDS lost from frames the node's process dropped.

Growth is judged after warm-up: by default the first 10 % of the run is warm-up (at least
until the node's frame history is full), growth = median of the last 10 % - median of the
10-20 % window, also given per hour; the warm-up rise is reported apart and both are plotted.
Writes ``soak.json`` (every sample and the summary) and ``soak.png`` to ``--out``, prints a
summary line, and exits 1 when a threshold fails: any loss, RSS growth above
``--max-rss-growth-mb`` (or ``--max-rss-growth-mb-per-hour``), fd or thread growth above their
bounds. Exit 2: the node did not start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos_reason_ros.core.stats import percentile
from cosmos_reason_ros.ros.node_process import stop_node, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]


def config_dir() -> Path:
    """Return the presets folder: the source tree's ``config/``, else the installed share."""
    local = REPO_ROOT / "config"
    if local.is_dir():
        return local
    from ament_index_python.packages import get_package_share_directory

    return Path(get_package_share_directory("cosmos_reason_ros")) / "config"


def start_node(model: str, preset: str, periodic_s: float, extra: Sequence[str],
               traced: Sequence[str] = ()) -> subprocess.Popen:
    """Start the node (periodic monitoring on unless ``periodic_s`` is 0); output to a pipe.

    ``traced`` (dir, start_s, period_s) runs it under tracemalloc (:func:`traced_node_main`).
    """
    entry = ["cosmos_reason_ros.bench.soak", "--as-traced-node", *traced] if traced else [
        "cosmos_reason_ros.ros.node"]
    args = [sys.executable, "-m", *entry, "--ros-args", "--params-file",
            str(config_dir() / f"{preset}.yaml"), "-p", "image.max_age_s:=10.0"]
    if periodic_s > 0:
        args += ["-p", "periodic.enabled:=true", "-p", f"periodic.period_s:={periodic_s}",
                 "-p", "periodic.prompt:=Is the way ahead blocked?",
                 "-p", "periodic.max_tokens:=4"]
    if model:
        args += ["-p", f"engine.model:={model}"]
    for item in extra:
        args += ["-p", item]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def render_frame(t: float, width: int, height: int) -> Any:
    """Draw a synthetic RGB frame: a gradient with a box moving across it."""
    import numpy as np

    frame = np.empty((height, width, 3), np.uint8)
    frame[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    frame[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    frame[..., 2] = 128
    x = int((0.5 + 0.4 * np.sin(t)) * (width - width // 5))
    frame[height // 3: height // 3 + height // 5, x: x + width // 5] = (220, 40, 40)
    return frame


def jpeg_image(rgb: Any, header: Any) -> Any:
    """Encode an RGB frame as a JPEG ``sensor_msgs/CompressedImage`` (quality 90)."""
    import cv2
    from sensor_msgs.msg import CompressedImage

    ok, data = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return CompressedImage(header=header, format="jpeg", data=data.tobytes())


def camera_qos(reliability: str, depth: int) -> Any:
    """Keep-last QoS of ``depth`` with ``reliability`` (best_effort or reliable)."""
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.BEST_EFFORT if reliability == "best_effort"
                      else ReliabilityPolicy.RELIABLE)


class FrameProbe:
    """A second camera reader with the node's camera QoS, in a process of its own.

    Counts what DDS delivers across processes to a reader that is never starved (it does
    nothing else) and the reader's DDS *sample lost* status (samples the middleware knows it
    never delivered, e.g. a best-effort frame missing a fragment). Frames the probe got but the
    node did not were lost inside the node's process (its reader's keep-last queue overwritten
    before its executor took them); frames the probe lost too were lost by DDS. A process of
    its own, because Fast DDS hands samples between participants of one process directly.
    """

    def __init__(self, topic: str, compressed: bool, reliability: str, depth: int) -> None:
        """Start the probe process; its counts arrive as JSON lines on its stdout."""
        self._counts = {"frames_probe_received": 0, "frames_probe_lost": 0}
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cosmos_reason_ros.bench.soak", "--as-probe", topic,
             "jpeg" if compressed else "raw", reliability, str(depth)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, name="frame_probe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self._counts = json.loads(line)

    def counts(self) -> dict[str, int]:
        """Frames received and reported lost so far."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        """Stop the probe (it ends when its stdin closes) and read its last counts."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._reader.join(5.0)


def probe_main(topic: str, fmt: str, reliability: str, depth: int) -> int:
    """Run the probe process: count frames and sample-lost events until stdin closes."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import CompressedImage, Image

    try:  # Iron and later; Humble has the same class in rclpy.qos_event
        from rclpy.event_handler import SubscriptionEventCallbacks
    except ImportError:  # pragma: no cover - Humble
        from rclpy.qos_event import SubscriptionEventCallbacks

    counts = {"frames_probe_received": 0, "frames_probe_lost": 0}
    lock = threading.Lock()

    def on_frame(_data: bytes) -> None:
        with lock:
            counts["frames_probe_received"] += 1

    def on_lost(info: Any) -> None:
        with lock:
            counts["frames_probe_lost"] += info.total_count_change

    rclpy.init()
    node = rclpy.create_node("soak_frame_probe")
    node.create_subscription(
        CompressedImage if fmt == "jpeg" else Image, topic, on_frame,
        camera_qos(reliability, depth), raw=True,
        event_callbacks=SubscriptionEventCallbacks(message_lost=on_lost))
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    while True:
        finished = done.wait(0.5)
        with lock:
            print(json.dumps(counts), flush=True)
        if finished:
            break
    executor.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def sample_process(pid: int) -> dict[str, float]:
    """RSS (MB: node + children, and the node alone), open fds and threads of the node."""
    import psutil

    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    rss = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            pass
    node_rss = proc.memory_info().rss
    return {"rss_mb": rss / 2**20, "rss_node_mb": node_rss / 2**20,
            "rss_children_mb": (rss - node_rss) / 2**20, "fds": proc.num_fds(),
            "threads": proc.num_threads()}


def traced_node_main(out: str, start_s: float, period_s: float, node_args: list[str]) -> None:
    """Run the node and trace its Python allocations from ``start_s`` on.

    Tracing starts after the engine's start-up (traced, vLLM's start-up ran past its 300 s
    timeout here); a snapshot is dumped to ``out`` every ``period_s``.
    """
    import tracemalloc

    def snapshots() -> None:
        time.sleep(start_s)
        tracemalloc.start(10)
        for i in range(1_000_000):
            time.sleep(period_s)
            tracemalloc.take_snapshot().dump(f"{out}/snap_{i:04d}.tm")

    Path(out).mkdir(parents=True, exist_ok=True)
    threading.Thread(target=snapshots, name="tracemalloc", daemon=True).start()
    from cosmos_reason_ros.ros.node import main as node_main

    node_main(node_args)


def tracemalloc_report(snap_dir: Path, path: Path, top: int = 20) -> str:
    """Compare the first and last snapshots of the node's Python heap; write the top growth."""
    import tracemalloc

    snaps = sorted(snap_dir.glob("snap_*.tm"))
    if len(snaps) < 2:
        return f"soak: tracemalloc: {len(snaps)} snapshot(s) in {snap_dir}, need 2"
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    first, last = (tracemalloc.Snapshot.load(str(p)).filter_traces(ignore)
                   for p in (snaps[0], snaps[-1]))
    mb = [sum(t.size for t in snap.traces) / 2**20 for snap in (first, last)]
    lines = [f"node Python heap (tracemalloc): {mb[0]:.2f} MB ({snaps[0].name}) -> "
             f"{mb[1]:.2f} MB ({snaps[-1].name}), {len(snaps)} snapshots"]
    for d in last.compare_to(first, "lineno")[:top]:
        frame = d.traceback[0]
        lines.append(f"{d.size_diff / 1024:+10.1f} KiB {d.count_diff:+7d} blocks "
                     f"{frame.filename}:{frame.lineno}")
    path.write_text("\n".join(lines) + "\n")
    return f"soak: {lines[0]}; top growth in {path}"


def _window_median(samples: list[dict[str, Any]], key: str, t0: float, t1: float) -> float:
    vals = [s[key] for s in samples if t0 <= s["t"] <= t1]
    return statistics.median(vals) if vals else float("nan")


def windows(samples: list[dict[str, Any]], args: argparse.Namespace
            ) -> dict[str, tuple[float, float]]:
    """Return the warm-up, baseline and final windows (seconds since the start).

    By default (growth as the reliability targets define it) the first 10 % of the run is
    warm-up, the baseline is the next 10 % and the final window the last 10 %: growth =
    median(last 10 %) - median(10-20 %). ``--warmup-s`` / ``--window-s`` override the two
    lengths; warm-up lasts at least until the node's frame history is full
    (``node_frames_stored`` at its maximum).
    """
    end = samples[-1]["t"] if samples else 0.0
    window = args.window_s if args.window_s else 0.1 * end
    warmup = args.warmup_s if args.warmup_s is not None else 0.1 * end
    # The frame history filling up (64 frames, ~59 MB at 640x480) is warm-up, however long a
    # starved node takes to receive them: the baseline starts once the history is full.
    stored = [s.get("node_frames_stored", 0) for s in samples]
    if stored and max(stored) > 0:
        warmup = max(warmup, next(s["t"] for s in samples
                                  if s.get("node_frames_stored", 0) == max(stored)))
    warmup = min(warmup, max(0.0, end - 2 * window))  # a short run still gets two windows
    return {"warmup": (0.0, warmup), "baseline": (warmup, warmup + window),
            "final": (end - window, end)}


def evaluate(samples: list[dict[str, Any]], counts: dict[str, int], args: argparse.Namespace
             ) -> dict[str, Any]:
    """Warm-up and growth figures, losses and which thresholds failed (pure; unit-testable).

    ``growth`` is what grew after warm-up (final window median - baseline window median);
    ``warmup`` is what the warm-up took (baseline median - first sample), kept apart so that
    filling caches and arenas at the start is not mistaken for a leak.
    """
    win = windows(samples, args)
    growth, warmup = {}, {}
    keys = ["rss_mb", "fds", "threads"]
    keys += [k for k in ("rss_node_mb", "rss_children_mb") if samples and k in samples[0]]
    for key in keys:
        base = _window_median(samples, key, *win["baseline"])
        growth[key] = _window_median(samples, key, *win["final"]) - base
        warmup[key] = base - samples[0][key] if samples else float("nan")
    span_h = (sum(win["final"]) - sum(win["baseline"])) / 2 / 3600
    rss_per_hour = growth["rss_mb"] / span_h if span_h > 0 else float("nan")
    not_sent = counts.get("goals_not_sent", 0)
    lost_goals = counts["goals_sent"] - counts["goal_results"] - not_sent
    lost_periodic = max(0, counts["periodic_counted"] - counts["periodic_results"])
    failures = []
    if lost_goals:
        failures.append(f"{lost_goals} goals without a result")
    if not_sent:
        failures.append(f"{not_sent} goals not sent (the client found no action server)")
    if lost_periodic:
        failures.append(f"{lost_periodic} periodic runs not published")
    if not counts.get("periodic_count_exact", True):
        failures.append("the final periodic count did not settle (no quiet status in the drain)")
    if counts["goal_results"] and counts["goals_ok"] == 0:
        failures.append("no goal succeeded")
    if growth["rss_mb"] > args.max_rss_growth_mb:
        failures.append(f"RSS grew {growth['rss_mb']:.1f} MB > {args.max_rss_growth_mb} MB")
    if args.max_rss_growth_mb_per_hour and rss_per_hour > args.max_rss_growth_mb_per_hour:
        failures.append(f"RSS grew {rss_per_hour:.1f} MB/hour > "
                        f"{args.max_rss_growth_mb_per_hour} MB/hour")
    if growth["fds"] > args.max_fd_growth:
        failures.append(f"open fds grew by {growth['fds']:.0f} > {args.max_fd_growth}")
    if growth["threads"] > args.max_thread_growth:
        failures.append(f"threads grew by {growth['threads']:.0f} > {args.max_thread_growth}")
    return {"growth": growth, "warmup": warmup, "windows": win, "goals_not_sent": not_sent,
            "rss_growth_mb_per_hour": rss_per_hour, "lost_goals": lost_goals,
            "lost_periodic": lost_periodic, "failures": failures, "passed": not failures}


def plot(samples: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """Four panels over time: RSS (warm-up shaded, window medians drawn), fds, threads, counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    win = summary["windows"]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for ax, key, label in ((axes[0], "rss_mb", "RSS (MB, node + children)"),
                           (axes[1], "fds", "open file descriptors"),
                           (axes[2], "threads", "threads")):
        ax.plot(t, [s[key] for s in samples], lw=0.8)
        ax.axvspan(*win["warmup"], color="0.85", label="warm-up")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    rss = axes[0]
    for name, color in (("baseline", "tab:green"), ("final", "tab:red")):
        t0, t1 = win[name]
        level = _window_median(samples, "rss_mb", t0, t1)
        rss.hlines(level, t0, t1, colors=color, lw=3, label=f"{name} median {level:.1f}")
    rss.set_title(f"warm-up +{summary['warmup']['rss_mb']:.1f} MB; after warm-up "
                  f"{summary['growth']['rss_mb']:+.1f} MB "
                  f"({summary['rss_growth_mb_per_hour']:+.1f} MB/hour)")
    rss.legend(loc="lower right", fontsize=8)
    for key in ("goals_sent", "goal_results", "periodic_results", "frames_published"):
        axes[3].plot(t, [s[key] / (10 if key == "frames_published" else 1) for s in samples],
                     label=key if key != "frames_published" else "frames published / 10")
    axes[3].set_ylabel("count")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="upper left")
    axes[3].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def final_periodic_count(client: Any, lock: threading.Lock, diag_seen: threading.Condition,
                         last_diag: dict[str, str], counts: dict[str, int], drain_s: float
                         ) -> tuple[int, bool, int]:
    """Stop periodic runs; return the node's final periodic count, exact or not, and results.

    The results are the periodic results received when the count was read.

    The node starts no periodic run while a goal is running or queued, counts a run only after
    publishing its result, and clears ``periodic_busy`` only after counting. So a status that
    shows a goal in the node and ``periodic_busy`` 0 holds the final count: every run so far
    is counted and on ~/results, and no other can start. The goal that holds the node waits
    for a next frame that never comes (the camera has stopped) and is cancelled after. Then
    we wait for our subscription to have every counted result (bounded by ``drain_s``). The
    results are taken at that moment too: once the holding goal is cancelled, periodic runs
    start again, and a result of one of those has no place in the count read before.
    """
    from cosmos_reason_interfaces.action import Reason

    hold = client.submit(client.goal("soak drain: hold the node", source=Reason.Goal.SOURCE_NEXT,
                                     wait_for_image_s=drain_s, timeout_s=drain_s + 5.0))

    def quiet() -> bool:
        return bool(last_diag) and last_diag.get("periodic_busy") == "0" and (
            int(last_diag.get("goals_active", 0)) + int(last_diag.get("goals_queued", 0))) > 0

    deadline = time.monotonic() + drain_s
    with lock:
        exact = diag_seen.wait_for(quiet, timeout=drain_s)
        counted = counts["periodic_counted"]
        if exact:
            diag_seen.wait_for(lambda: counts["periodic_results"] >= counted,
                               timeout=max(0.0, deadline - time.monotonic()))
        results = counts["periodic_results"]
    hold.cancel()
    try:
        hold.result(timeout_s=10.0)
    except Exception:  # noqa: BLE001, S110 - the hold goal's own outcome does not matter
        pass
    return counted, exact, results


def run(args: argparse.Namespace) -> int:
    """Run the soak; return the exit status."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import MultiThreadedExecutor
    from sensor_msgs.msg import CompressedImage, Image
    from std_msgs.msg import Header

    from cosmos_reason_interfaces.msg import ReasoningResult
    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.ros.messages import ns_to_stamp, rgb_image

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Subscribe before the node starts: every periodic result the node counts must reach us,
    # and one published before our reader matched the node's writer is never delivered (a
    # volatile topic). A soak's "lost" periodic result was such a run: the node's first
    # runs (no frame yet) went out while the soak was still creating its subscription.
    rclpy.init()
    node = rclpy.create_node("soak")
    executor = MultiThreadedExecutor()
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    lock = threading.Lock()
    diag_seen = threading.Condition(lock)
    counts = {"goals_sent": 0, "goal_results": 0, "goals_ok": 0, "goals_not_sent": 0,
              "periodic_results": 0,
              "periodic_counted": 0, "periodic_skipped": 0, "frames_published": 0,
              "node_frames_received": 0,
              "node_frames_stored": 0}
    last_diag: dict[str, str] = {}
    codes: dict[str, int] = {}
    latencies: list[float] = []

    def on_result(msg: ReasoningResult) -> None:
        if msg.origin == "periodic":
            with lock:
                counts["periodic_results"] += 1
                diag_seen.notify_all()

    def on_diag(msg: DiagnosticArray) -> None:
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            if "periodic_run" in values:
                with lock:
                    counts["periodic_counted"] = int(values["periodic_run"]) + int(
                        values["periodic_failed"])
                    # Ticks that found a goal running or queued: periodic runs yield to goals.
                    counts["periodic_skipped"] = int(values.get("periodic_skipped", 0))
                    counts["node_frames_received"] = int(values["frames_received"])
                    counts["node_frames_stored"] = int(values["frames_stored"])
                    last_diag.clear()
                    last_diag.update(values)
                    diag_seen.notify_all()

    results_sub = node.create_subscription(ReasoningResult, "/cosmos_reason/results",
                                           on_result, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    jpeg = args.camera_format == "jpeg"
    camera_type, camera_topic = (CompressedImage, "/image/compressed") if jpeg else (
        Image, "/image")
    camera = node.create_publisher(camera_type, camera_topic,
                                   camera_qos(args.camera_reliability, args.camera_depth))
    probe = FrameProbe(camera_topic, jpeg, args.camera_reliability, args.node_qos_depth) \
        if args.probe else None
    node_params = [f"image.qos_reliability:={args.camera_reliability}",
                   f"image.qos_depth:={args.node_qos_depth}",
                   *(["image.input:=compressed"] if jpeg else []), *args.param]

    def give_up(code: int) -> int:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        if probe is not None:
            probe.close()
        if proc is not None:
            stop_node(proc)
        return code

    proc: subprocess.Popen | None = None
    log: list[str] = []
    pid = args.node_pid
    if not args.connect:
        model = args.model
        if not model and args.preset == "cpu_demo":
            from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

            model = str(ensure_tiny_model("qwen3_vl"))
        traced = (args.tracemalloc, str(args.tracemalloc_start_s),
                  str(args.tracemalloc_period_s)) if args.tracemalloc else ()
        proc = start_node(model, args.preset, args.periodic_s, node_params, traced)
        if not wait_ready(proc, log, args.startup_timeout_s):
            print("soak: the node did not become ready:\n" + "\n".join(log[-30:]))
            return give_up(2)
        pid = proc.pid
    if not pid:
        print("soak: --connect needs --node-pid to sample the node's resources")
        return give_up(2)
    # The node's ~/results writer exists from its constructor on, before the engine is up and
    # the first periodic run starts, so with a local engine the two have matched long before.
    match_deadline = time.monotonic() + 10.0
    # Node.count_publishers, not Subscription.get_publisher_count: the latter is Iron and later.
    while node.count_publishers(results_sub.topic_name) == 0 \
            and time.monotonic() < match_deadline:
        time.sleep(0.05)
    if node.count_publishers(results_sub.topic_name) == 0:
        print("soak: warning: ~/results not matched at start; early periodic results may be "
              "missed", flush=True)
    periodic_offset = 0
    if args.connect:
        # A running node counted runs we never saw: count from the first status we get.
        with lock:
            diag_seen.wait_for(lambda: bool(last_diag), timeout=10.0)
            periodic_offset = counts["periodic_counted"] - counts["periodic_results"]
    client = ReasonClient(node_name="soak_client")  # its own participant, not the camera's
    if not client.wait_for_server(30.0):
        print("soak: no action server")
        client.close()
        return give_up(2)

    stop = threading.Event()

    def stream() -> None:
        t0 = time.monotonic()
        n = 0
        while not stop.is_set():
            frame = render_frame(time.monotonic() - t0, args.width, args.height)
            header = Header(stamp=ns_to_stamp(node.get_clock().now().nanoseconds),
                            frame_id="soak_camera")
            camera.publish(jpeg_image(frame, header) if jpeg else rgb_image(frame, header))
            n += 1
            with lock:
                counts["frames_published"] = n
            stop.wait(max(0.0, t0 + n / args.camera_hz - time.monotonic()))

    def on_done(future: Any, t_sent: float) -> None:
        error = future.exception()
        if error is not None:  # the client never sent it (no action server), or transport
            with lock:
                counts["goals_not_sent"] += 1
                name = type(error).__name__
                codes[name] = codes.get(name, 0) + 1
            return
        result = future.result()
        with lock:
            counts["goal_results"] += 1
            counts["goals_ok"] += int(result.ok)
            codes[result.error_code.name] = codes.get(result.error_code.name, 0) + 1
            if result.ok:
                latencies.append(time.monotonic() - t_sent)

    def goals() -> None:
        i = 0
        t0 = time.monotonic()
        while args.goal_period_s > 0 and not stop.is_set():
            goal = client.goal(f"Question {i}: what is on the table?",
                               max_tokens=args.max_tokens, max_image_age_s=10.0)
            t_sent = time.monotonic()
            handle = client.submit(goal)
            handle.future.add_done_callback(lambda f, t=t_sent: on_done(f, t))
            i += 1
            with lock:
                counts["goals_sent"] = i
            stop.wait(max(0.0, t0 + i * args.goal_period_s - time.monotonic()))

    samples: list[dict[str, Any]] = []
    threading.Thread(target=stream, daemon=True).start()
    threading.Thread(target=goals, daemon=True).start()
    t_start = time.monotonic()
    print(f"soak: running {args.duration_s:.0f} s (camera {args.camera_hz:g} Hz "
          f"{args.width}x{args.height} {args.camera_format} {args.camera_reliability} "
          f"node depth {args.node_qos_depth}, a goal every {args.goal_period_s:g} s, periodic "
          f"every {args.periodic_s:g} s; 0 = off)", flush=True)
    try:
        while (now := time.monotonic()) - t_start < args.duration_s:
            sample = {"t": now - t_start, **sample_process(pid)}
            with lock:
                sample.update(counts)
            if probe is not None:
                sample.update(probe.counts())
            samples.append(sample)
            if args.verbose and len(samples) % 10 == 0:
                print(json.dumps(sample), flush=True)
            time.sleep(max(0.0, t_start + len(samples) - time.monotonic()))
    finally:
        stop.set()
    # Drain: every goal sent must get its result.
    deadline = time.monotonic() + args.drain_s
    while time.monotonic() < deadline:
        with lock:
            if counts["goal_results"] + counts["goals_not_sent"] >= counts["goals_sent"]:
                break
        time.sleep(0.1)
    counted, exact, results = final_periodic_count(
        client, lock, diag_seen, last_diag, counts, args.drain_s) \
        if args.periodic_s > 0 else (0, True, 0)
    with lock:
        final = dict(counts)
    final["periodic_results"] = results
    if probe is not None:
        probe.close()  # the camera has stopped: its last line holds the final counts
        final.update(probe.counts())
    final["periodic_counted"] = counted - periodic_offset
    final["periodic_count_exact"] = exact
    summary = evaluate(samples, final, args)
    report = {
        "config": {k: v for k, v in vars(args).items()},
        "counts": final, "codes": codes,
        "goal_latency_s": {"p50": percentile(latencies, 50),
                           "p95": percentile(latencies, 95)},
        "rss_mb": {"first": samples[0]["rss_mb"] if samples else None,
                   "max": max((s["rss_mb"] for s in samples), default=None),
                   "last": samples[-1]["rss_mb"] if samples else None},
        **summary, "samples": samples,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    if samples:
        plot(samples, summary, out / "soak.png")
    g = summary["growth"]
    print(f"soak: {'PASS' if summary['passed'] else 'FAIL'} duration_s={args.duration_s:.0f} "
          f"goals_sent={final['goals_sent']} goal_results={final['goal_results']} "
          f"goals_ok={final['goals_ok']} goals_not_sent={final['goals_not_sent']} "
          f"codes={codes} "
          f"periodic_results={final['periodic_results']} "
          f"periodic_counted={final['periodic_counted']} "
          f"periodic_skipped={final['periodic_skipped']} "
          f"frames_published={final['frames_published']} "
          f"frames_received={final['node_frames_received']} "
          + (f"frames_probe_received={final['frames_probe_received']} "
             f"frames_probe_lost={final['frames_probe_lost']} " if probe is not None else "")
          + f"periodic_count_exact={final['periodic_count_exact']} "
          f"rss_warmup_mb={summary['warmup']['rss_mb']:.1f} "
          f"rss_growth_mb={g['rss_mb']:.1f} "
          f"rss_growth_mb_per_hour={summary['rss_growth_mb_per_hour']:.1f} "
          + (f"rss_growth_node_mb={g['rss_node_mb']:.1f} "
             f"rss_growth_children_mb={g['rss_children_mb']:.1f} " if "rss_node_mb" in g else "")
          + f"fd_growth={g['fds']:.0f} "
          f"thread_growth={g['threads']:.0f} goal_p50_s={report['goal_latency_s']['p50']:.3f} "
          f"out={out}" + (f" failures={summary['failures']}" if summary["failures"] else ""),
          flush=True)
    client.close()
    executor.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    if proc is not None:
        code = stop_node(proc)
        if args.tracemalloc:
            print(tracemalloc_report(Path(args.tracemalloc), out / "tracemalloc.txt"), flush=True)
        if code != 0:
            print(f"soak: the node exited with {code}:\n" + "\n".join(log[-20:]))
            return 1
    return 0 if summary["passed"] else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--camera-hz", type=float, default=10.0)
    p.add_argument("--goal-period-s", type=float, default=1.0, help="0: no goals")
    p.add_argument("--periodic-s", type=float, default=1.0, help="0: periodic runs off")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--camera-format", choices=("raw", "jpeg"), default="raw",
                   help="rgb8 Image on /image, or JPEG CompressedImage on /image/compressed "
                   "(the node then gets image.input:=compressed)")
    p.add_argument("--camera-reliability", choices=("best_effort", "reliable"),
                   default="best_effort", help="camera QoS, for the publisher and the node")
    p.add_argument("--camera-depth", type=int, default=5,
                   help="the camera publisher's keep-last depth (5: sensor-data QoS)")
    p.add_argument("--node-qos-depth", type=int, default=1,
                   help="the node's camera queue depth (image.qos_depth)")
    p.add_argument("--probe", action="store_true",
                   help="count frames at a second reader with the node's QoS and its DDS "
                   "sample-lost status (where frames are lost)")
    p.add_argument("--model", default="", help="checkpoint (default: the tiny test model)")
    p.add_argument("--preset", default="cpu_demo")
    p.add_argument("--param", action="append", default=[],
                   help="extra node parameter NAME:=VALUE (repeatable)")
    p.add_argument("--connect", action="store_true", help="use a running node")
    p.add_argument("--node-pid", type=int, default=0, help="with --connect: the node's pid")
    p.add_argument("--out", default="out/soak")
    p.add_argument("--warmup-s", type=float, default=None,
                   help="seconds of warm-up before the baseline window (default: 10 %% of the run)")
    p.add_argument("--window-s", type=float, default=None,
                   help="length of the baseline and final windows (default: 10 %% of the run)")
    p.add_argument("--drain-s", type=float, default=60.0)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--max-rss-growth-mb", type=float, default=100.0,
                   help="fail above this RSS growth after warm-up (final - baseline median)")
    p.add_argument("--max-rss-growth-mb-per-hour", type=float, default=0.0,
                   help="fail above this growth rate after warm-up (0: no limit)")
    p.add_argument("--max-fd-growth", type=float, default=20)
    p.add_argument("--max-thread-growth", type=float, default=10)
    p.add_argument("--tracemalloc", default="", metavar="DIR",
                   help="run the node under tracemalloc: snapshots in DIR, the top growth "
                   "between the first and last in OUT/tracemalloc.txt")
    p.add_argument("--tracemalloc-start-s", type=float, default=150.0,
                   help="start tracing this long after launch (after the engine's start-up)")
    p.add_argument("--tracemalloc-period-s", type=float, default=300.0)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    for name in ("duration_s", "camera_hz"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("goal_period_s", "periodic_s"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0 (0: off)")
    for name in ("window_s", "warmup_s"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--as-probe"]:  # FrameProbe's child process
        return probe_main(argv[1], argv[2], argv[3], int(argv[4]))
    if argv[:1] == ["--as-traced-node"]:  # start_node(traced=...)
        traced_node_main(argv[1], float(argv[2]), float(argv[3]), argv[4:])
        return 0
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
