"""Replay a rosbag2 recording against a scenario of questions; score, record and report.

    # through a running node (started with use_sim_time:=true, camera remapped as needed)
    replay BAG --scenario S.yaml --out DIR
    replay BAG --scenario S.yaml --out DIR --rate 2        # twice the recorded rate
    replay BAG --scenario S.yaml --out DIR --rate max      # as fast as the node keeps up
    # offline: the same requests straight to an engine, no ROS (quick prompt iteration)
    replay BAG --scenario S.yaml --out DIR --mode offline --preset cpu_demo --model /models/m
    # offline with 3D: the bag's registered depth + CameraInfo lift answers as the node would
    replay BAG --scenario S.yaml --out DIR --mode offline --model M --param depth.enabled:=true
    # several cameras: the bag's topics named as the node's cameras (the default one first)
    replay BAG --scenario S.yaml --out DIR --camera front=/camera/image_raw \
        --camera wrist=/wrist/image_raw/compressed

Node mode publishes the bag's messages (sqlite3 or mcap, read with ``rosbags``) under their
recorded topic names (``--remap FROM:=TO`` to rename) with ``/clock`` following the bag time,
and sends each scheduled query as a ``~/reason`` goal (``--node-name``). At the recorded rate
goals run while the stream goes on, like on the robot; with ``--rate max`` each goal is answered
before the stream moves on, so every query sees the frame at its scheduled time.

Offline mode builds the very requests the node builds (``core.query``: same resize, prompts,
schema and sampling) from the bag's frames at each query time and runs them on an engine
made from a config preset. With ``depth.enabled`` in the preset (or ``--param
depth.enabled:=true``) it also reads the bag's registered depth and CameraInfo topics (the
only 16UC1/32FC1 Image and CameraInfo topics, or ``--depth-topic`` / ``--camera-info-topic``)
and lifts answers to 3D as the node does (``core/answer3d.py``), so results carry
``position_3d``, ``lift_code`` and ``depth_stamp``. The bag's clock stands still at a query's
time while it runs: only messages recorded by then are used, so a depth frame recorded later
than its colour frame's query (late depth) is not (the node lifts after generating and may
also use depth that arrived meanwhile; offline results do not depend on the engine's speed).
Through the node, start the node with depth on and its ``depth/image`` and ``camera_info``
remapped to the bag's topics (``tools/demo.py`` does); before the first goal the replay waits,
at most ``--depth-inputs-timeout`` each, for the node to subscribe to them and to acknowledge
what was published, and reports per topic in ``summary.json`` (``depth_inputs``) and the
printed summary, so a first goal without CameraInfo is explained, not a random NO_DEPTH.

Several cameras (``--camera NAME=TOPIC``, repeatable, or the scenario's ``cameras``; the
first is the default camera) map the bag's image topics to camera names, and queries name
the cameras they ask about (``cameras: [front, wrist]``). Offline, the preset gets
``cameras.names`` from them and each camera's frames fill its own history, as in the node.
Through the node, start it with the same ``cameras.names`` and each camera's topics remapped
to the bag's (``-r front/image:=/camera/image_raw -r
wrist/image/compressed:=/wrist/image_raw/compressed``).

Outputs in ``--out``: ``results.jsonl`` (one line per query: the ``ReasoningResult`` in plain
form, the status and the scores), ``results_bag/`` (the same ``ReasoningResult`` messages,
readable by ``ros2 bag`` and ``rosbags``), ``report.html`` with ``latency.png`` and annotated
frames, ``summary.json``. Exit status: 0 when nothing regressed, 1 when a scored expectation
failed (or a goal failed, with the scenario's ``fail_on_error``), 2 for a bad scenario, bag or
argument, 3 when the node or engine cannot be reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from cosmos_reason_ros.core.cameras import camera_name_problem
from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode
from cosmos_reason_ros.eval import bagio, report, scoring
from cosmos_reason_ros.eval.replay_node import ACK_WAIT_S, run_through_node
from cosmos_reason_ros.eval.replay_offline import OfflineRunner
from cosmos_reason_ros.eval.replay_records import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_UNREACHABLE,
    Recorder,
    ReplayConfig,
    ReplayError,
    ReplayRun,
    plain_ns,
)
from cosmos_reason_ros.eval.scenario import (
    Scenario,
    ScenarioError,
    build_schedule,
    load_scenario,
)

# The replay command's Python face; the node-mode player, the offline runner and the records
# live in replay_node, replay_offline and replay_records.
__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_REGRESSION", "EXIT_UNREACHABLE", "ReplayConfig",
           "ReplayError", "ReplayRun", "build_parser", "config_from_args", "main", "parse_rate",
           "print_summary", "run_replay"]
_LOG = logging.getLogger("replay")


# --- the run -----------------------------------------------------------------------------------


def write_frames(cfg: ReplayConfig, info: bagio.BagInfo, image_topic: str,
                 records: list[dict[str, Any]]) -> dict[int, str]:
    """Second pass over the bag: draw each answered query's frame (bounded count).

    The frame drawn is the result header's: the first camera's of a multi-camera goal (its
    topic from ``cfg.cameras``), with that camera's items (``report.annotate_frame``).
    """
    wanted: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(records):
        stamp = plain_ns(r["result"]["header"].get("stamp"))
        frames = r["result"].get("camera_frames") or []
        topic = cfg.cameras.get(frames[0]["camera"], image_topic) if frames else image_topic
        if stamp and len(wanted) < cfg.report_frames:
            wanted.setdefault((topic, stamp), []).append(i)
    store = bagio.typestore()
    written: dict[int, str] = {}
    topics = sorted({topic for topic, _stamp in wanted})
    for topic, msgtype, _t, data in bagio.messages(info.path, topics):
        if len(written) == sum(len(v) for v in wanted.values()):
            break
        msg = store.deserialize_cdr(data, msgtype)
        for i in wanted.get((topic, bagio.header_stamp_ns(msg)), ()):
            try:
                rgb = bagio.decode_image(msg, msgtype)
                written[i] = report.write_frame(cfg.out, i, records[i], rgb)
            except CosmosReasonError as e:
                _LOG.warning("frame for %s not drawn: %s", records[i]["query"], e.message)
    return written


def run_replay(cfg: ReplayConfig, engine: Any = None) -> ReplayRun:
    """Replay ``cfg.bag`` against ``cfg.scenario``; raise ``ReplayError`` if it cannot run.

    ``engine``: offline, an ``engines.base.Engine`` to use instead of the preset's.
    """
    try:
        scenario = load_scenario(cfg.scenario)
        info = bagio.bag_info(cfg.bag)
        cfg = dataclasses.replace(cfg, cameras=replay_cameras(cfg, scenario, info))
        image_topic = next(iter(cfg.cameras.values())) if cfg.cameras \
            else bagio.pick_image_topic(info, cfg.image_topic or scenario.image_topic)
        schedule = build_schedule(scenario, info.duration_s)
        truth = bagio.load_ground_truth(cfg.bag, scenario.ground_truth_topic)
        truth_3d = bagio.load_ground_truth_3d(cfg.bag, scenario.ground_truth_topic)
    except (ScenarioError, bagio.BagError) as e:
        raise ReplayError(str(e), EXIT_BAD_INPUT) from e
    if cfg.mode != "offline" and (cfg.params or cfg.depth_topic or cfg.camera_info_topic):
        raise ReplayError("--param, --depth-topic and --camera-info-topic are for --mode "
                          "offline; through the node, set its parameters and remaps",
                          EXIT_BAD_INPUT)
    offline = OfflineRunner(cfg, engine) if cfg.mode == "offline" else None
    recorder = Recorder(cfg, scenario, info, truth, truth_3d)
    bar = _progress(len(schedule), cfg.progress)
    depth_inputs: list[dict[str, Any]] = []
    undelivered: dict[str, dict[str, int]] = {}
    try:
        if offline is not None:
            offline.run(schedule, info, image_topic, recorder, bar.update)
        else:
            depth_inputs, undelivered = run_through_node(cfg, scenario, schedule, info,
                                                         image_topic, recorder, bar.update)
    finally:
        bar.close()
        if offline is not None:
            offline.close()
    records = recorder.close(schedule)
    summary = scoring.summarize(records, scenario.fail_on_error)
    (cfg.out / "summary.json").write_text(json.dumps(
        {**summary.to_dict(), "scenario": scenario.name, "bag": str(cfg.bag),
         "mode": cfg.mode, "depth_inputs": depth_inputs, "undelivered": undelivered},
        indent=1))
    frames = write_frames(cfg, info, image_topic, records)
    meta = {"scenario": scenario.name, "bag": f"{cfg.bag} ({info.storage}, "
            f"{info.duration_s:.2f} s)", "image topic": image_topic, "mode": cfg.mode,
            "rate": "max" if cfg.rate is None else f"{cfg.rate:g}x"}
    if cfg.cameras:
        meta["cameras"] = ", ".join(f"{name}={topic}" for name, topic in cfg.cameras.items())
    html = report.write_report(cfg.out, records, frames, meta, summary.to_dict())
    return ReplayRun(records, summary, recorder.jsonl_path, recorder.bag_path, html,
                     depth_inputs, undelivered)


def replay_cameras(cfg: ReplayConfig, scenario: Scenario, info: bagio.BagInfo
                   ) -> dict[str, str]:
    """Return camera name -> bag image topic (``--camera``, else the scenario's); may be empty.

    Every topic must be an image topic of the bag, each camera its own; every camera a query
    names must be one of them. Raises ``ScenarioError`` / ``BagError`` naming the problem.
    """
    cameras = dict(cfg.cameras) or dict(scenario.cameras)
    for name, topic in cameras.items():
        bagio.pick_image_topic(info, topic)  # refuses a topic that is not an image topic
        others = [n for n, t in cameras.items() if t == topic and n != name]
        if others:
            raise ScenarioError(f"cameras {name} and {others[0]} both name {topic}: give each "
                                f"camera its own topic")
    if cameras and cfg.image_topic and cfg.image_topic != next(iter(cameras.values())):
        raise ScenarioError(f"--image-topic {cfg.image_topic} with cameras: the default "
                            f"camera's topic is the first camera's ({next(iter(cameras))}="
                            f"{next(iter(cameras.values()))}); leave --image-topic out")
    for query in scenario.queries:
        unknown = [c for c in query.goal.cameras if c not in cameras]
        if unknown:
            known = ", ".join(cameras) or "none (give --camera NAME=TOPIC or the scenario's "
            "cameras)"
            raise ScenarioError(f"query {query.name!r} names camera {unknown[0]!r}; cameras "
                                f"mapped to the bag's topics: {known}")
    return cameras


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="replay", unit="query", disable=not enabled,
                file=sys.stderr, dynamic_ncols=True)


def print_summary(run: ReplayRun, out: Any = sys.stdout) -> None:
    """Per-query lines and the totals."""
    for r in run.records:
        res = r["result"]
        code = res.get("error_code", 0)
        what = (f"{1000 * res['total_s']:.0f} ms  {res['answer'][:70]!r}" if code == 0
                else f"{ErrorCode(code).name}: {res['error_message'][:90]}"
                if code in ErrorCode._value2member_map_ else f"error {code}")
        marks = " ".join(("ok" if s["passed"] else "FAIL" if not s["informational"] else "miss")
                         + f":{s['kind']}" for s in r["scores"])
        print(f"  {r['query']}#{r['occurrence']:<3} t={r['t_s']:6.2f}s {r['status']:<9} {what}"
              + (f"  [{marks}]" if marks else ""), file=out)
        if r["status"] != "succeeded" and r.get("delivery"):  # which hop it waited for
            hops = " ".join(f"{k}={v}" for k, v in r["delivery"].items())
            print(f"      client's view: {hops}", file=out)
    for item in run.depth_inputs:
        print(f"replay: {item['kind']} {item['topic']}: {item['status']}", file=out)
    for topic, counts in run.undelivered.items():
        print(f"replay: {topic}: {counts['unacknowledged']} recorded messages not acknowledged "
              f"by the node within {ACK_WAIT_S:g} s, {counts['failed']} not published", file=out)
    s = run.summary
    print(f"replay: {s.queries} queries, {s.succeeded} succeeded, {s.errors} failed; "
          f"{s.scored} expectations checked: {s.passed} passed, {s.failed} failed "
          f"({s.informational_failed} informational); regressions: {s.regressions} -> "
          f"{'PASS' if s.ok else 'REGRESSION'}", file=out)
    if run.report is not None:
        print(f"replay: report {run.report}", file=out)


def parse_rate(text: str) -> float | None:
    """``--rate``: a positive factor of the recorded rate, or ``max`` (``None``)."""
    if text == "max":
        return None
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rate {text!r}: a positive number or 'max'") from e
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--rate {text!r}: a positive number or 'max'")
    return value


def _remap(text: str) -> tuple[str, str]:
    src, sep, dst = text.partition(":=")
    if not sep or not src or not dst:
        raise argparse.ArgumentTypeError(f"--remap {text!r}: expected FROM:=TO")
    return src, dst


def _camera(text: str) -> tuple[str, str]:
    """``--camera NAME=TOPIC``: a camera name (ROS name token) and the bag's image topic."""
    name, sep, topic = text.partition("=")
    problem = camera_name_problem(name) if sep else "is missing"
    if problem or not topic.startswith("/"):
        raise argparse.ArgumentTypeError(
            f"--camera {text!r}: expected NAME=TOPIC, e.g. front=/camera/image_raw (name "
            f"{problem or 'ok'}; the topic an absolute name)")
    return name, topic


def _camera_map(pairs: list[tuple[str, str]]) -> dict[str, str]:
    cameras: dict[str, str] = {}
    for name, topic in pairs:
        if name in cameras:
            raise ReplayError(f"--camera {name}= is given twice", EXIT_BAD_INPUT)
        cameras[name] = topic
    return cameras


def _param(text: str) -> tuple[str, Any]:
    """``--param NAME:=VALUE``: the value read as YAML, as ``ros2 run ... -p`` reads it."""
    import yaml

    name, sep, value = text.partition(":=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--param {text!r}: expected NAME:=VALUE")
    try:
        return name.strip(), yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"--param {text!r}: value is not YAML ({e})") from e


def build_parser() -> argparse.ArgumentParser:
    """Build the command line parser."""
    ap = argparse.ArgumentParser(prog="replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bag", type=Path, help="rosbag2 directory (sqlite3 or mcap)")
    ap.add_argument("--scenario", type=Path, required=True, help="scenario YAML")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--mode", choices=("node", "offline"), default="node")
    ap.add_argument("--rate", type=parse_rate, default=1.0,
                    help="playback rate (1 = recorded) or 'max' (node mode)")
    ap.add_argument("--image-topic", default="", help="the bag's camera topic (default: "
                    "the scenario's, else the bag's only image topic)")
    ap.add_argument("--camera", type=_camera, action="append", default=[],
                    metavar="NAME=TOPIC", help="the bag's image topic of camera NAME "
                    "(repeatable; the first is the default camera; default: the scenario's "
                    "cameras): queries name cameras by NAME")
    ap.add_argument("--node-name", default="cosmos_reason")
    ap.add_argument("--remap", type=_remap, action="append", default=[],
                    help="publish a bag topic under another name, FROM:=TO (repeatable)")
    ap.add_argument("--preset", default="cpu_demo", help="offline: config preset (name or "
                    "path)")
    ap.add_argument("--model", default="", help="offline: checkpoint (overrides the preset)")
    ap.add_argument("--param", type=_param, action="append", default=[],
                    help="offline: a node parameter over the preset's, NAME:=VALUE (repeatable),"
                    " e.g. depth.enabled:=true to lift answers to 3D")
    ap.add_argument("--depth-topic", default="", help="offline with depth: the bag's registered "
                    "depth topic (default: its only 16UC1/32FC1 Image topic)")
    ap.add_argument("--camera-info-topic", default="", help="offline with depth: the bag's "
                    "colour CameraInfo topic (default: its only CameraInfo topic)")
    ap.add_argument("--results-storage", choices=bagio.STORAGES, default="",
                    help="results bag storage (default: the input bag's)")
    ap.add_argument("--goal-timeout", type=float, default=300.0,
                    help="seconds to wait for one result")
    ap.add_argument("--connect-timeout", type=float, default=30.0,
                    help="seconds to wait for the node's action server (at the start and "
                    "for each goal) and camera topic")
    ap.add_argument("--depth-inputs-timeout", type=float, default=10.0,
                    help="node mode, depth on: seconds to wait for the node to subscribe to "
                    "the bag's depth and CameraInfo topics, and to receive them before the "
                    "first goal (reported in summary.json when it runs out)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """Arguments -> ``ReplayConfig``."""
    return ReplayConfig(
        bag=args.bag, scenario=args.scenario, out=args.out, mode=args.mode, rate=args.rate,
        image_topic=args.image_topic, node_name=args.node_name.strip("/"),
        remaps=dict(args.remap), preset=args.preset, model=args.model, params=dict(args.param),
        cameras=_camera_map(args.camera),
        depth_topic=args.depth_topic, camera_info_topic=args.camera_info_topic,
        results_storage=args.results_storage, goal_timeout_s=args.goal_timeout,
        connect_timeout_s=args.connect_timeout,
        depth_inputs_timeout_s=args.depth_inputs_timeout, progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 pass, 1 regression, 2/3 errors)."""
    logging.basicConfig(level=logging.WARNING, format="replay: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        run = run_replay(config_from_args(args))
    except ReplayError as e:
        print(f"replay: {e}", file=sys.stderr)
        return e.exit_code
    print_summary(run)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
