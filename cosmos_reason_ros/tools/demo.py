"""The demo: a recorded camera scene replayed through the real node, scored and reported.

    make demo                                          # CPU, tiny random-weight model
    make demo MODEL=/models/Cosmos-Reason2-2B          # GPU machine: real answers (x86_gpu)
    make demo DEMO_ARGS="--rate max --duration 6"

1. Generates the demo recording (``demo_recording``: 640x480 at 15 Hz, Image +
   CompressedImage + CameraInfo + registered 16UC1 depth + 2D/3D ground truth, and a
   smaller wrist-style view (320x240 JPEG), a real rosbag2 bag), cached in
   ``out/demo/recording`` while its parameters stay the same.
2. Starts the node as its own process (the way ``ros2 launch`` would) from a config preset
   with ``use_sim_time``, two named cameras (``front`` on the recording's colour topic,
   ``wrist`` on its compressed wrist view) and depth input on for ``front``
   (``front/depth/image`` and ``front/camera_info`` remapped to the recording's), so
   grounding answers are lifted to 3D and scored against the 3D ground truth
   (``position_error``).
3. Replays the demo scenario (``config/scenarios/demo.yaml``: a question, grounding every
   1.5 s, a yes/no check, the next frame, a clip, a question about both cameras) through the
   node with ``replay``.
4. Prints each answer and the summary; the report (annotated frames, latencies, scores) is
   ``out/demo/replay/report.html``.

With the tiny model the words are random (its weights are), so the scenario's semantic
expectations are informational; the structural ones (answers that follow their task's JSON
schema) and every goal succeeding are what make the demo pass or fail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cosmos_reason_ros.eval import demo_recording
from cosmos_reason_ros.ros.node_process import stop_node, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = REPO_ROOT / "config" / "scenarios" / "demo.yaml"
DEMO_CAMERAS = ("front", "wrist")  # as config/scenarios/demo.yaml names them


def start_node(model: str, preset: str, image_topic: str, depth: bool = True
               ) -> subprocess.Popen:
    """Start the node process from a config preset, on sim time, cameras remapped.

    Two named cameras, as the recording has: ``front`` (the default camera) on
    ``image_topic``, raw, and ``wrist`` on the recording's compressed wrist view. With
    ``depth``, the front camera also takes the recording's registered depth and CameraInfo.
    """
    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args", "--params-file",
            str(REPO_ROOT / "config" / f"{preset}.yaml"), "-p", f"engine.model:={model}",
            "-p", "use_sim_time:=true",
            # Reliable camera QoS: 900 kB frames over best effort can be lost on a busy
            # machine, and the replay should answer about the frames it scheduled. Depth
            # frames take the same QoS.
            "-p", "image.qos_reliability:=reliable", "-p", "image.qos_depth:=10",
            "-p", f"cameras.names:=[{DEMO_CAMERAS[0]},{DEMO_CAMERAS[1]}]",
            "-p", "cameras.inputs:=[raw,compressed]",
            "-r", f"{DEMO_CAMERAS[0]}/image:={image_topic}",
            "-r", f"{DEMO_CAMERAS[1]}/image/compressed:={demo_recording.WRIST_TOPIC}"]
    if depth:
        args += ["-p", "depth.enabled:=true",
                 "-r", f"{DEMO_CAMERAS[0]}/depth/image:={demo_recording.DEPTH_TOPIC}",
                 "-r", f"{DEMO_CAMERAS[0]}/camera_info:={demo_recording.CAMERA_INFO_TOPIC}"]
    return subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run(args: argparse.Namespace, model: str, preset: str) -> int:
    """Run the demo; return the exit status (the replay's: 0 pass, 1 regression, ...)."""
    from cosmos_reason_ros.eval.replay import ReplayConfig, ReplayError, print_summary, run_replay

    t0 = time.monotonic()
    out: Path = args.out
    params = demo_recording.RecordingParams(duration_s=args.duration, storage=args.storage)
    recording = demo_recording.ensure_recording(out / "recording", params)
    print(f"demo: recording {recording} ({params.width}x{params.height} at {params.fps:g} Hz, "
          f"{params.duration_s:g} s, {params.storage}) ready after "
          f"{time.monotonic() - t0:.1f} s", flush=True)
    print(f"demo: starting the node (preset={preset}, model={model})", flush=True)
    log: list[str] = []
    proc = start_node(model, preset, demo_recording.IMAGE_TOPIC, depth=not args.no_depth)
    try:
        if not wait_ready(proc, log, args.startup_timeout):
            print("demo: the node did not become ready:\n" + "\n".join(log[-30:]))
            return 3
        ready = next((line for line in log if "]: ready: " in line), "")
        print("demo: " + ready.split("]: ")[-1] + f" (after {time.monotonic() - t0:.1f} s)",
              flush=True)
        replay_out = out / "replay"
        if replay_out.exists():
            shutil.rmtree(replay_out)
        cfg = ReplayConfig(bag=recording, scenario=args.scenario, out=replay_out, mode="node",
                           rate=args.rate, connect_timeout_s=60.0,
                           progress=sys.stderr.isatty())
        try:
            result = run_replay(cfg)
        except ReplayError as e:
            print(f"demo: replay failed: {e}\n" + "\n".join(log[-20:]))
            return e.exit_code
    finally:
        stop_node(proc)
    print_summary(result)
    summary = {**result.summary.to_dict(), "report": str(result.report),
               "jsonl": str(result.jsonl), "results_bag": str(result.results_bag),
               "wall_s": round(time.monotonic() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"demo: {'PASS' if result.summary.ok else 'REGRESSION'} in {summary['wall_s']} s; "
          f"open {result.report}")
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the demo."""
    from cosmos_reason_ros.eval.replay import parse_rate

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("MODEL", ""),
                    help="checkpoint directory (default: $MODEL, else the cached tiny model)")
    ap.add_argument("--preset", default="", help="config preset (default: cpu_demo for the "
                    "tiny model, x86_gpu for --model)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "demo")
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO)
    ap.add_argument("--duration", type=float, default=4.0, help="recording length (s)")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--rate", type=parse_rate, default=1.0, help="replay rate, or 'max'")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--no-depth", action="store_true",
                    help="run the node without depth input (2D answers only)")
    args = ap.parse_args(argv)
    model, preset = args.model, args.preset
    if not model:
        from cosmos_reason_ros.eval.tiny_model import ensure_tiny_model

        model = str(ensure_tiny_model("qwen3_vl"))
        preset = preset or "cpu_demo"
    return run(args, model, preset or "x86_gpu")


if __name__ == "__main__":
    sys.exit(main())
