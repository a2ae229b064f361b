"""What a replay is asked to do and what it writes down: config, exit codes, records.

The node-mode player (``replay_node``), the offline runner (``replay_offline``) and the run
(``replay``) share these; ``Recorder`` scores each result and writes ``results.jsonl`` and the
results bag.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos_reason_ros.core.types import CosmosReasonError, ErrorCode, FinishReason
from cosmos_reason_ros.eval import bagio, scoring
from cosmos_reason_ros.eval.scenario import Scenario, ScheduledQuery

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"latest": 0, "next": 1, "clip": 2}
FEEDBACK_STAGES = 1  # Reason.Goal.FEEDBACK_STAGES: replay reads the stages, never the text
EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
NS = 1_000_000_000



class ReplayError(Exception):
    """The replay cannot go on; ``exit_code`` says why (bad input or unreachable)."""

    def __init__(self, message: str, exit_code: int = EXIT_UNREACHABLE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class ReplayConfig:
    """What to replay, how, and where the outputs go."""

    bag: Path
    scenario: Path
    out: Path
    mode: str = "node"  # node | offline
    rate: float | None = 1.0  # None: as fast as the node keeps up
    image_topic: str = ""
    node_name: str = "cosmos_reason"
    remaps: dict[str, str] = field(default_factory=dict)
    preset: str = "cpu_demo"  # offline: config preset name or path
    model: str = ""  # offline: overrides engine.model
    results_storage: str = ""  # default: the input bag's storage
    goal_timeout_s: float = 300.0  # replay-side bound on waiting for one result
    connect_timeout_s: float = 30.0
    # Node mode, depth on: longest wait for the node to subscribe to the bag's depth and
    # CameraInfo topics, and again for it to acknowledge them before the first goal.
    depth_inputs_timeout_s: float = 10.0
    settle_s: float = 0.2  # --rate max: let the last frame arrive before a goal
    progress: bool = True
    report_frames: int = 200  # annotated frames written at most
    params: dict[str, Any] = field(default_factory=dict)  # offline: overrides the preset's
    depth_topic: str = ""  # offline with depth: the bag's depth topic (default: the only one)
    camera_info_topic: str = ""  # offline with depth: default the bag's only CameraInfo topic
    # Camera name -> the bag's image topic, the default camera first (--camera; default: the
    # scenario's cameras); empty: one camera on image_topic.
    cameras: dict[str, str] = field(default_factory=dict)


@dataclass
class ReplayRun:
    """What a replay produced."""

    records: list[dict[str, Any]]
    summary: scoring.Summary
    jsonl: Path
    results_bag: Path
    report: Path | None
    # Node mode: what became of the bag's depth and CameraInfo topics before the first goal.
    depth_inputs: list[dict[str, Any]] = field(default_factory=list)
    # Node mode: topic -> recorded messages the node did not acknowledge in time / not published.
    undelivered: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when nothing regressed, else 1."""
        return EXIT_OK if self.summary.ok else EXIT_REGRESSION


# --- records -----------------------------------------------------------------------------------


def stamp_plain(ns: int) -> dict[str, int]:
    """Return a ``builtin_interfaces/Time`` in plain form (negative times clamp to 0)."""
    ns = max(0, int(ns))
    return {"sec": ns // NS, "nanosec": ns % NS}


def plain_ns(stamp: dict[str, int] | None) -> int:
    """Return the nanoseconds of a plain ``builtin_interfaces/Time`` (0 for none)."""
    return 0 if not stamp else int(stamp["sec"]) * NS + int(stamp["nanosec"])


def error_result(error: CosmosReasonError, item: ScheduledQuery, model: str = "",
                 header: dict[str, Any] | None = None) -> dict[str, Any]:
    """Plain ``ReasoningResult`` of a query that failed before or during generation."""
    cancelled = error.code is ErrorCode.CANCELLED
    return {"header": header or {}, "origin": "goal", "model": model, "task": item.query.goal.task,
            "prompt": item.query.goal.prompt, "error_code": int(error.code),
            "error_message": error.message,
            "finish_reason": (FinishReason.CANCELLED if cancelled else FinishReason.ERROR).value}


class Recorder:
    """Turns results into records (scored), writes the JSONL file and the results bag."""

    def __init__(self, cfg: ReplayConfig, scenario: Scenario, info: bagio.BagInfo,
                 truth: bagio.GroundTruth, truth_3d: bagio.GroundTruth3D | None = None) -> None:
        """Open the outputs (``cfg.out`` must not hold a previous run's results bag)."""
        self.cfg, self.scenario, self.info, self.truth = cfg, scenario, info, truth
        self.truth_3d = truth_3d or {}
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = cfg.out / "results.jsonl"
        self.bag_path = cfg.out / "results_bag"
        if self.bag_path.exists():
            raise ReplayError(f"{self.bag_path} exists: choose a new --out or remove it",
                              EXIT_BAD_INPUT)
        # Records are streamed here as they finish (a crash keeps them); the final JSONL and
        # the results bag are written in schedule order by ``close``.
        self.partial_path = cfg.out / "results.jsonl.partial"
        self._partial = self.partial_path.open("w", encoding="utf-8")
        self.records: list[dict[str, Any]] = []
        self._cdr: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def add(self, item: ScheduledQuery, status: str, plain: dict[str, Any],
            delivery: dict[str, Any] | None = None) -> dict[str, Any]:
        """Score one result, append it to the JSONL file and the bag; return the record.

        ``delivery`` is the client's view of the goal's trip (``Delivery.to_dict``), kept in
        the record so a goal that never came back says which hop it was waiting for.
        """
        result, cdr = bagio.canonical_result(plain)
        stamp = plain_ns(result["header"]["stamp"])
        truth = bagio.truth_at(self.truth, stamp) if stamp else None
        truth_3d = bagio.truth_at(self.truth_3d, stamp) if stamp else None
        scores = scoring.score_result(item.query.expect, result, truth, truth_3d)
        scheduled_ns = self.info.start_ns + int(round(item.t_s * NS))
        record = {
            "query": item.query.name, "occurrence": item.occurrence, "t_s": item.t_s,
            "mode": self.cfg.mode, "status": status,
            "frame_offset_s": (stamp - scheduled_ns) / NS if stamp else None,
            "ground_truth": {k: list(v) for k, v in truth.items()} if truth else None,
            "ground_truth_3d": truth_3d.to_dict() if truth_3d else None,
            "scores": [s.to_dict() for s in scores], "result": result,
            "delivery": delivery,
        }
        record["regression"] = scoring.is_regression(record, self.scenario.fail_on_error)
        with self._lock:
            self._partial.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._partial.flush()
            self._cdr[id(record)] = cdr
            self.records.append(record)
        return record

    def close(self, schedule: tuple[ScheduledQuery, ...]) -> list[dict[str, Any]]:
        """Write the JSONL file and the results bag in schedule order; return the records.

        Bag times are the scheduled times (strictly increasing: queries scheduled together
        are 1 ns apart), so ``ros2 bag`` and ``rosbags`` read the results in this order too.
        """
        self._partial.close()
        order = {(s.query.name, s.occurrence): i for i, s in enumerate(schedule)}
        records = sorted(self.records, key=lambda r: order[(r["query"], r["occurrence"])])
        last_ns = 0
        with self.jsonl_path.open("w", encoding="utf-8") as jsonl, bagio.ResultsBagWriter(
                self.bag_path, self.cfg.results_storage or self.info.storage,
                topic=f"/{self.cfg.node_name}/results") as bag:
            for r in records:
                jsonl.write(json.dumps(r, ensure_ascii=False) + "\n")
                last_ns = max(last_ns + 1, self.info.start_ns + int(round(r["t_s"] * NS)))
                bag.write(self._cdr[id(r)], last_ns)
        self.partial_path.unlink()
        return records
