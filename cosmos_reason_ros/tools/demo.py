"""The demo: a synthetic camera stream through the real node, a few questions, the answers.

    make demo                                   # CPU, tiny random-weight model
    make demo DEMO_ARGS="--model /models/Cosmos-Reason2-2B --preset x86_gpu"   # real answers

Starts the node as its own process (the way ``ros2 launch`` would), publishes a 640x480 15 Hz
scene of moving labelled boxes on ``/image``, sends goals through the action interface
(free-form question, grounding, verify, next frame), prints each result, and saves the frame
with the returned boxes drawn next to the ground truth in ``out/demo/``. With the tiny model
the words are random (its weights are), but every part of the pipeline is the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
OBJECTS = (("red box", (220, 40, 40)), ("green cylinder", (40, 190, 60)),
           ("blue cup", (40, 80, 230)))


def render_scene(t: float, width: int = 640, height: int = 480
                 ) -> tuple[np.ndarray, dict[str, tuple[int, int, int, int]]]:
    """Draw the scene at time ``t``; return the RGB frame and ground-truth boxes."""
    frame = np.full((height, width, 3), (200, 190, 170), np.uint8)
    frame[int(height * 0.6):] = (120, 100, 80)  # a table top
    truth = {}
    for i, (label, colour) in enumerate(OBJECTS):
        cx = int(width * (0.2 + 0.3 * i) + 40 * np.sin(t * 0.8 + i))
        cy = int(height * 0.62)
        w, h = 70 + 10 * i, 90 - 10 * i
        box = (cx - w // 2, cy - h, cx + w // 2, cy)
        cv2.rectangle(frame, box[:2], box[2:], colour, thickness=-1)
        cv2.putText(frame, label, (box[0], box[1] - 6), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    (20, 20, 20), 1, cv2.LINE_AA)
        truth[label] = box
    return frame, truth


def start_node(model: str, preset: str) -> subprocess.Popen:
    """Start the node process from a config preset."""
    args = [sys.executable, "-m", "cosmos_reason_ros.ros.node", "--ros-args", "--params-file",
            str(REPO_ROOT / "config" / f"{preset}.yaml"), "-p", f"engine.model:={model}"]
    return subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_ready(proc: subprocess.Popen, log: list[str], timeout_s: float) -> bool:
    """Collect the node's output; return once it logs 'ready' (False if it exits first)."""
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line.rstrip())
            if "]: ready: " in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if ready.wait(0.5):
            return True
    return ready.is_set()


def draw_result(frame: np.ndarray, result: object, truth: dict) -> np.ndarray:
    """Ground truth in thin white, the model's boxes in thick yellow."""
    out = frame.copy()
    for x0, y0, x1, y1 in truth.values():
        cv2.rectangle(out, (x0, y0), (x1, y1), (255, 255, 255), 1)
    for box in result.boxes:
        p0, p1 = (int(box.x_min), int(box.y_min)), (int(box.x_max), int(box.y_max))
        cv2.rectangle(out, p0, p1, (255, 220, 0), 3)
        cv2.putText(out, box.label, (p0[0], max(12, p0[1] - 4)), cv2.FONT_HERSHEY_SIMPLEX,
                    0.5, (255, 220, 0), 1, cv2.LINE_AA)
    return out


def run(model: str, preset: str, out_dir: Path, startup_timeout_s: float) -> int:
    """Run the demo; return the exit status."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header

    from cosmos_reason_ros.client import ReasonClient
    from cosmos_reason_ros.ros.messages import rgb_image

    log: list[str] = []
    print(f"demo: starting the node (preset={preset}, model={model})", flush=True)
    proc = start_node(model, preset)
    try:
        if not wait_ready(proc, log, startup_timeout_s):
            print("demo: the node did not become ready:\n" + "\n".join(log[-30:]))
            return 1
        print("demo: " + next(line for line in log if "]: ready: " in line).split("]: ")[-1])
        rclpy.init()
        camera_node = rclpy.create_node("demo_camera")
        camera = camera_node.create_publisher(Image, "/image", qos_profile_sensor_data)
        latest: dict = {}
        stop = threading.Event()

        def stream() -> None:  # 15 Hz, stamped with the node clock, like a camera driver
            t0 = time.monotonic()
            while not stop.is_set():
                t = time.monotonic() - t0
                frame, truth = render_scene(t)
                header = Header(stamp=camera_node.get_clock().now().to_msg(),
                                frame_id="demo_camera")
                msg = rgb_image(frame, header)
                latest[(msg.header.stamp.sec, msg.header.stamp.nanosec)] = (frame, truth)
                while len(latest) > 60:
                    latest.pop(next(iter(latest)))
                camera.publish(msg)
                stop.wait(1 / 15)

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        deadline = time.monotonic() + 30  # DDS discovery can take seconds on a busy machine
        while camera.get_subscription_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        out_dir.mkdir(parents=True, exist_ok=True)
        queries = [
            ("question", ReasonClient.goal("What objects are on the table, and which one is "
                                           "closest to the left edge?", max_tokens=64,
                                           wait_for_image_s=10.0)),
            ("ground", ReasonClient.goal("", "ground", ["red box", "blue cup"],
                                         max_tokens=128)),
            ("verify", ReasonClient.goal("The green cylinder is between the other two "
                                         "objects.", "verify", max_tokens=96)),
            ("next frame", ReasonClient.goal("Describe the scene in one sentence.",
                                             source=1, max_tokens=48)),
        ]
        failures = 0
        with ReasonClient() as client:
            if not client.wait_for_server(30):
                print("demo: action server not found")
                return 1
            for name, goal in queries:
                result = client.run(goal, timeout_s=300)
                m = result.message
                print(f"\n== {name}: {result.status} ({result.error_code.name}) "
                      f"ttft={m.time_to_first_token_s * 1000:.0f} ms total="
                      f"{m.total_s * 1000:.0f} ms tokens={m.prompt_tokens}+{m.output_tokens} "
                      f"input={m.input_width}x{m.input_height}")
                print(f"   answer: {m.answer[:200]!r}")
                if m.answer_json:
                    print(f"   json:   {m.answer_json[:200]}")
                for b in result.boxes:
                    print(f"   box {b.label!r}: ({b.x_min:.0f}, {b.y_min:.0f}) - "
                          f"({b.x_max:.0f}, {b.y_max:.0f}) px in the 640x480 frame")
                if m.parse_problems:
                    print(f"   parse problems: {list(m.parse_problems)[:3]}")
                failures += not result.ok
                key = (m.header.stamp.sec, m.header.stamp.nanosec)
                if key in latest:
                    frame, truth = latest[key]
                    path = out_dir / f"{name.replace(' ', '_')}.png"
                    cv2.imwrite(str(path), cv2.cvtColor(draw_result(frame, result, truth),
                                                        cv2.COLOR_RGB2BGR))
                    print(f"   frame:  {path}")
        summary = {"queries": len(queries), "failed": failures, "out": str(out_dir)}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"\ndemo: {len(queries) - failures}/{len(queries)} queries succeeded; "
              f"frames in {out_dir}")
        stop.set()
        streamer.join(2)
        camera_node.destroy_node()
        rclpy.try_shutdown()
        return 0 if failures == 0 else 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the demo."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("MODEL", ""),
                    help="checkpoint directory (default: the cached tiny model)")
    ap.add_argument("--preset", default="", help="config preset (default: cpu_demo for the "
                    "tiny model, x86_gpu for --model)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "demo")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    model, preset = args.model, args.preset
    if not model:
        from cosmos_reason_ros.tools.tiny_model import ensure_tiny_model

        model = str(ensure_tiny_model("qwen3_vl"))
        preset = preset or "cpu_demo"
    return run(model, preset or "x86_gpu", args.out, args.startup_timeout)


if __name__ == "__main__":
    sys.exit(main())
