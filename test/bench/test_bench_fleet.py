"""The fleet mode's routing policies and their report rows (pure: no rclpy, no processes)."""

from __future__ import annotations

import pytest

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench.phases import fleet


def test_fleet_compares_hashing_sticky_cache_aware_and_round_robin_routers() -> None:
    # The advice in docs/DEPLOYMENT.md weighs these four against each other; the report's
    # target line compares "affinity" (consistent hashing) with "round_robin".
    assert sorted(fleet.POLICIES.values()) == ["cache_aware", "consistent_hash", "round_robin",
                                               "sticky_least_loaded"]
    assert fleet.POLICIES["affinity"] == "consistent_hash"
    assert fleet.POLICIES["round_robin"] == "round_robin"


def test_every_fleet_policy_is_one_the_installed_router_accepts() -> None:
    router = pytest.importorskip("vllm_router.router", reason="needs vllm-router (make setup)")
    for flag in fleet.POLICIES.values():
        assert router.policy_from_str(flag) is not None, flag  # KeyError when not offered


def _samples() -> list[dict]:
    # (policy, question) -> (node TTFT s, cached prompt tokens) of each goal; 100 prompt tokens.
    goals = {("affinity", 1): (0.30, 64), ("affinity", 2): (0.10, 96),
             ("sticky_least_loaded", 1): (0.20, 64), ("sticky_least_loaded", 2): (0.08, 96),
             ("cache_aware", 1): (0.50, 0), ("cache_aware", 2): (0.40, 32),
             ("round_robin", 1): (0.60, 0), ("round_robin", 2): (0.50, 0)}
    samples = []
    for r in range(-1, 3):
        for (policy, q), (ttft, cached) in goals.items():
            samples.append({"phase": "fleet", "mode": "node", "policy": policy, "robot": 0,
                            "question": q, "size": "640x480", "round": r, "warmup": r < 0,
                            "ok": True, "node_ttft_s": ttft, "ttft_s": ttft + 0.01,
                            "prompt_tokens": 100, "cached_prompt_tokens": cached})
    return samples


def test_report_has_a_row_per_policy_with_its_requests_per_backend() -> None:
    requests = {"affinity": {"backend0": 128.0, "backend1": 0.0},
                "sticky_least_loaded": {"backend0": 61.0, "backend1": 67.0},
                "cache_aware": {"backend0": 70.0, "backend1": 58.0},
                "round_robin": {"backend0": 64.0, "backend1": 64.0}}
    report = benchreport.render_report({"meta": {"device": "cpu"}, "samples": _samples(), "extra": {
        "fleet": {"robots_per_policy": 2, "camera_hz": 5.0, "policies": dict(fleet.POLICIES),
                  "requests_per_backend": requests}}})
    rows = {line.split("|")[1].strip(): line for line in report.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in fleet.POLICIES}
    assert set(rows) == set(fleet.POLICIES)
    assert rows["affinity"].rstrip(" |").endswith("128 / 0")
    assert rows["sticky_least_loaded"].rstrip(" |").endswith("61 / 67")
    hits = benchreport.fleet_hit_rates(_samples())
    assert hits[("sticky_least_loaded", "all")] == pytest.approx(0.8)
    assert hits[("round_robin", "all")] == 0.0


def _router_line(message: str) -> str:
    # As vllm-router 0.1.17 writes it: ANSI colours around the time, level and source.
    return (f"\x1b[2m2026-12-06 16:10:50\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mvllm_router_rs::"
            f"policies\x1b[0m\x1b[2m:\x1b[0m {message}\n")


WORKERS = ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]


def test_sessions_per_backend_counts_each_robot_camera_once_where_it_went_last() -> None:
    def hashed(key: str, worker: str) -> str:
        return _router_line(f"Consistent hash routing: key='header:x-session-id:{key}' -> "
                            f"worker='{worker}' (index=0)")

    log = "DEBUG: Server startup function called\n" + "".join([
        # The node's warm-up request has no session key: the router keys it by request id.
        _router_line("Consistent hash routing: key='header:x-request-id:warmup-d3f1a665' -> "
                     f"worker='{WORKERS[1]}' (index=1)"),
        hashed("/fleet/affinity/robot0/cosmos_reason/default", WORKERS[0]),
        hashed("/fleet/affinity/robot1/cosmos_reason/default", WORKERS[0]),
        hashed("/fleet/affinity/robot0/cosmos_reason/default", WORKERS[0]),  # every request
        hashed("/fleet/affinity/robot2/cosmos_reason/default", WORKERS[0]),
        hashed("/fleet/affinity/robot2/cosmos_reason/default", WORKERS[1] + "/"),  # moved
        hashed("/fleet/other/robot0/cosmos_reason/default", WORKERS[1]),  # another policy's
    ])
    assert fleet.sessions_per_backend(log, WORKERS, "/fleet/affinity/") == {
        "backend0": 2, "backend1": 1}


def test_sessions_per_backend_reads_sticky_placements_and_nothing_from_other_policies() -> None:
    log = "".join(_router_line(
        f"SLL: new session '/fleet/sticky_least_loaded/robot{i}/cosmos_reason/default' -> "
        f"replica '{WORKERS[i % 2]}' (active sessions on replica: 2)") for i in range(3))
    assert fleet.sessions_per_backend(log, WORKERS, "/fleet/sticky_least_loaded/") == {
        "backend0": 2, "backend1": 1}
    # round_robin and cache_aware log no placement: no figure rather than a made-up 0 / 0.
    assert fleet.sessions_per_backend(_router_line("Router ready | workers: [...]"), WORKERS,
                                      "/fleet/round_robin/") == {}
