"""The bench's ``results.md``: tables of the run's figures against their targets.

Pure Python, like ``stats`` (whose summaries, ratios and paired intervals it renders): one
section per phase (latency, overhead over the engine and the transport floor, concurrency,
prefill, cameras, planning, the fleet), each judged against ``TARGETS``.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cosmos_reason_ros.bench.stats import (
    Sample,
    decide,
    fmt,
    group,
    median_interval,
    paired_overhead,
    ratio,
    scaling,
    summarize,
    throughput,
)
from cosmos_reason_ros.core.stats import median

# --- rendering ------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Render a markdown table (numbers right-aligned)."""
    rows = [list(map(str, r)) for r in rows]
    align = ["---:" if rows and all(_numeric(r[i]) for r in rows) else "---"
             for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text.rstrip("x%").replace("+", ""))
        return True
    except ValueError:
        return text == "–"


def sort_key(value: Any) -> tuple[int, Any]:
    """Sort mixed keys: numbers first by value, then strings (sizes 'WxH' by pixel count)."""
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str) and "x" in value:
        w, _, h = value.partition("x")
        if w.isdigit() and h.isdigit():
            return (1, int(w) * int(h))
    return (2, str(value))


# --- the report -----------------------------------------------------------------------------

TARGETS = {
    "cpu": {"overhead_ms": 5.0, "baseline_ratio": 3.0, "scaling_8": 2.5, "ingest_ms": 0.5,
            "rss_mb": 20.0},
    "gpu": {"overhead_percent": 3.0, "scaling_8": 5.0, "second_ratio": 0.5,
            "prefill_ttft_ratio": 0.4, "prefill_throughput_ratio": 0.9, "p2_ratio": 3.0,
            "prefill_ttft_spread": 1.5},
}


# Where in the 5 Hz camera's 200 ms period a goal came (its prefill starts as a frame lands).
_PHASE_BUCKETS_MS = (0, 50, 100, 150, 200)


def _prefill_phase_table(samples: list[Sample]) -> list[str]:
    """Node TTFT by where in the camera's period each goal came, per prefill setting.

    A running prefill cannot be preempted by a goal (one engine step, and the engine's input
    processing before it), so goals that come just after a frame wait for its prefill: this
    table shows whether the slow goals are those.
    """
    phased = [s for s in samples if s.get("camera_phase_s") is not None
              and s.get("mode") == "node"]
    if not phased:
        return []

    labels = [f"{lo}-{hi} ms" for lo, hi in itertools.pairwise(_PHASE_BUCKETS_MS)]
    labels.append(f">= {_PHASE_BUCKETS_MS[-1]} ms")
    for s in phased:
        ms = s["camera_phase_s"] * 1e3
        s["camera_phase"] = next((label for label, hi in zip(labels, _PHASE_BUCKETS_MS[1:],
                                                             strict=False) if ms < hi),
                                 labels[-1])
    keys = ("setting", "camera_phase")
    ttft = summarize(phased, keys, "node_ttft_s")
    newest = {k: sum(bool(s.get("on_newest_frame")) for s in g)
              for k, g in group(phased, keys).items()}
    rows = [(setting, phase, t.n, newest[(setting, phase)], _ms(t.median), _ms(t.p95))
            for (setting, phase), t in sorted(ttft.items(),
                                              key=lambda kv: (kv[0][0], labels.index(kv[0][1])))]
    return ["", table(("prefill", "goal came after the newest frame", "goals",
                       "on that frame", "node TTFT p50 ms", "node TTFT p95 ms"), rows),
            "", "A frame every 200 ms; a prefill of a new frame starts when it lands. 'On that "
            "frame': answered on the frame that was newest when the goal was sent (else an "
            "older, prefilled one, or a newer one)."]


def _ms(value: float) -> str:
    return fmt(value * 1e3 if value is not None and not math.isnan(value) else math.nan)


def _check(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "MISSED")


def _nonnegative(value: float | None) -> float:
    """Return the value, or NaN when missing or negative (a difference that lost its meaning)."""
    if value is None or math.isnan(value) or value < 0:
        return math.nan
    return value


def _latency_phase(s: Sample) -> bool:
    return s.get("phase") == "latency"


def _breakdown(samples: Sequence[Sample]) -> list[tuple[Any, ...]]:
    """Per size: median components of the node's and the baseline's latency (ms)."""
    by_size: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if not s.get("ok") or s.get("warmup") or s.get("phase") != "latency":
            continue
        d = by_size[s.get("size")]
        if s.get("mode") == "node" and s.get("node_total_s") is not None:
            d["queue"].append(s.get("node_queue_s") or 0.0)
            d["pre"].append(s.get("node_preprocess_s") or 0.0)
            d["action"].append(s["e2e_s"] - s["node_total_s"])
        if s.get("mode") == "baseline" and s.get("http_total_s") is not None:
            d["encode"].append(s.get("encode_s") or 0.0)
            d["http"].append(s["http_total_s"])
            d["ros"].append(s["e2e_s"] - s["http_total_s"] - (s.get("encode_s") or 0.0))
            d["jpeg"].append((s.get("jpeg_bytes") or 0) / 1024 / 1e3)
    return [(size, *(_ms(median(d[k])) for k in ("queue", "pre", "action", "encode", "http",
                                                  "ros", "jpeg")))
            for size, d in sorted(by_size.items(), key=lambda kv: sort_key(kv[0]))]


def render_report(data: Mapping[str, Any]) -> str:
    """Render the markdown report: medians and p95s per mode, ratios, targets, errors."""
    meta = data.get("meta", {})
    samples = data.get("samples", [])
    extra = data.get("extra", {})
    device = meta.get("device", "cpu")
    lines = [f"# bench results ({device})", ""]
    lines.append(f"`bench {' '.join(meta.get('argv', []))}` — started {meta.get('started', '?')}"
                 f", model `{meta.get('model', '?')}`")
    versions = meta.get("versions", {})
    if versions:
        lines.append("")
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if extra.get("start_s"):
        lines.append("")
        lines.append("Start (s, in parallel): " + ", ".join(
            f"{k} {fmt(v)}" for k, v in extra["start_s"].items()))
    lines += ["", "## Modes", ""]
    rows = []
    for name, status in data.get("modes", {}).items():
        detail = status.get("error") or status.get("reason") or ""
        if status.get("rounds") is not None:
            detail = f"{status['rounds']}/{status.get('wanted')} rounds " + detail
        rows.append((name, status.get("status", "?"), fmt(status.get("elapsed_s")),
                     str(detail).replace("\n", " ").replace("|", "/")[:300]))
    lines.append(table(("mode", "status", "seconds", "detail"), rows))

    targets = TARGETS.get(device, {})
    checks: list[tuple[str, str, str]] = []

    # Latency per mode, size and length.
    ttft = summarize(samples, ("mode", "size", "length"), "ttft_s", _latency_phase)
    e2e = summarize(samples, ("mode", "size", "length"), "e2e_s", _latency_phase)
    toks = summarize(samples, ("mode", "size", "length"), "output_tokens", _latency_phase)
    if e2e:
        lines += ["", "## Latency (ms; client-observed; median / p95)", ""]
        rows = []
        for key in sorted(e2e, key=lambda k: (sort_key(k[1]), sort_key(k[2]), str(k[0]))):
            t, e, n = ttft.get(key), e2e[key], toks.get(key)
            tps = (n.median / e.median) if n and e.median else math.nan
            rows.append((key[1], key[2], key[0], e.n, _ms(t.median if t else math.nan),
                         _ms(t.p95 if t else math.nan), _ms(e.median), _ms(e.p95),
                         fmt(n.median if n else math.nan, 0), fmt(tps, 0)))
        lines.append(table(("size", "length", "mode", "n", "TTFT p50", "TTFT p95", "e2e p50",
                            "e2e p95", "out tokens", "tok/s"), rows))

    over = paired_overhead(samples, "node", "engine", "e2e_s", where=_latency_phase)
    if over:
        lines += ["", "## Node overhead over the bare engine (end-to-end, paired rounds)", "",
                  "Pairs: the two modes' requests of one round on the same picture, counted only "
                  "when both produced the same number of tokens (the node cannot ask for "
                  "ignore_eos, so a long answer may stop early there).", ""]
        rows = []
        for key in sorted(over, key=lambda k: (sort_key(k[0]), sort_key(k[1]))):
            o, d = over[key]
            low, high = median_interval(o.deltas_ms)
            rows.append((key[0], key[1], d.n, fmt(o.reference_ms), fmt(o.mode_ms), fmt(d.median),
                         f"{fmt(low)} to {fmt(high)}", fmt(d.p95),
                         fmt(100 * ratio(d.median, o.mode_ms))))
        lines.append(table(("size", "length", "pairs", "engine p50 ms", "node p50 ms",
                            "overhead p50 ms", "95 % interval ms", "overhead p95 ms",
                            "% of node e2e"), rows))
        # Judged on short answers: the length every mode reaches, so only the path differs.
        # The largest median decides; its 95 % interval says whether the pairs suffice.
        at720 = [(o, d) for k, (o, d) in over.items() if k[0] == "1280x720"
                 and k[1] == "short"] or [(o, d) for k, (o, d) in over.items()
                                          if k[0] == "1280x720"]
        if at720:
            o, d = max(at720, key=lambda od: od[1].median)
            if "overhead_ms" in targets:
                limit = targets["overhead_ms"]
                checks.append(("node overhead p50 at 1280x720, short answers",
                               f"{fmt(d.median)} ms (target <= {limit:g} ms)",
                               decide(o.deltas_ms, limit).text()))
            if "overhead_percent" in targets:
                pct = targets["overhead_percent"]
                limit = pct / 100.0 * o.mode_ms
                checks.append(("node overhead at 1280x720, short answers",
                               f"{fmt(100 * ratio(d.median, o.mode_ms))} % (target <= {pct:g} "
                               f"%, {fmt(limit)} ms)", decide(o.deltas_ms, limit).text()))

    floor_lines, floor_checks = _floor_section(samples, extra.get("floor") or {})
    lines += floor_lines
    checks += floor_checks

    base = paired_overhead(samples, "baseline", "node", "e2e_s", where=_latency_phase)
    if base:
        lines += ["", "## Node vs the HTTP-client baseline (end-to-end medians)", ""]
        rows = []
        short_ratios = []
        for key in sorted(base, key=lambda k: (sort_key(k[0]), sort_key(k[1]))):
            o, d = base[key]
            r = ratio(o.mode_ms, o.reference_ms)
            if key[1] == "short":
                short_ratios.append(r)
            t_node = ttft.get(("node", *key))
            t_base = ttft.get(("baseline", *key))
            rt = ratio(t_base.median, t_node.median) if t_node and t_base else math.nan
            rows.append((key[0], key[1], fmt(o.reference_ms), fmt(o.mode_ms), fmt(d.median),
                         f"{fmt(r, 2)}x", f"{fmt(rt, 2)}x"))
        lines.append(table(("size", "length", "node p50 ms", "baseline p50 ms",
                            "baseline - node p50 ms", "e2e baseline/node", "TTFT baseline/node"),
                           rows))
        if short_ratios and "baseline_ratio" in targets:
            worst = min(short_ratios)
            checks.append(("baseline/node latency, short answers (worst size)",
                           f"{fmt(worst, 2)}x (target >= {targets['baseline_ratio']:g}x)",
                           _check(worst >= targets["baseline_ratio"])))

    breakdown = _breakdown(samples)
    if breakdown:
        lines += ["", "## Where the time goes (medians over every latency sample, ms)", "",
                  "node: queue and preprocess (deserialize, convert, resize) as the node "
                  "reports them, action = client e2e minus the node's own total (goal, "
                  "result and feedback transport). baseline: encode = convert + JPEG + base64 "
                  "in the callback, http = POST to last byte, ros = trigger and answer "
                  "transport.", ""]
        lines.append(table(("size", "node queue", "node preprocess", "node action",
                            "baseline encode", "baseline http", "baseline ros",
                            "baseline JPEG KB"), breakdown))
        row = next((r for r in breakdown if r[0] == "1280x720"), None)
        if row is not None and "overhead_ms" in targets:
            own = sum(float(x) for x in row[2:4] if x != "–")
            limit = targets["overhead_ms"]
            checks.append(("node's own work at 1280x720: preprocess + action transport "
                           "(resize included)", f"{fmt(own)} ms (target <= {limit:g} ms)",
                           _check(own <= limit)))

    tput = throughput(data.get("batches", []))
    if tput:
        lines += ["", "## Concurrency (output tokens/s over the batch; median / p95)", ""]
        rows = []
        for mode in sorted({k[0] for k in tput}):
            sc = scaling(tput, mode)
            for (m, n), s in sorted(tput.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
                if m == mode:
                    rows.append((mode, n, s.n, fmt(s.median), fmt(s.p95),
                                 f"{fmt(sc.get(n, math.nan), 2)}x"))
        status = data.get("modes", {}).get("concurrency", {})
        lines.append(f"Image {status.get('size', '?')}, {status.get('max_tokens', '?')} output "
                     f"tokens per request; node: N goals on one fresh frame; engine: N pictures.")
        lines.append("")
        lines.append(table(("mode", "N", "batches", "tok/s p50", "tok/s p95", "vs N=1"), rows))
        s8 = scaling(tput, "node").get(8)
        if s8 is not None and "scaling_8" in targets:
            checks.append(("node throughput, 8 concurrent vs 1", f"{fmt(s8, 2)}x (target >= "
                           f"{targets['scaling_8']:g}x)", _check(s8 >= targets["scaling_8"])))

    second = summarize(samples, ("mode", "size", "question"), "ttft_s",
                       lambda s: s.get("phase") == "second")
    cached = summarize(samples, ("mode", "size", "question"), "cached_prompt_tokens",
                       lambda s: s.get("phase") == "second")
    if second:
        lines += ["", "## Second question on the same frame (TTFT ms, median)", ""]
        rows = []
        worst_node = []
        for mode, size in sorted({(k[0], k[1]) for k in second},
                                 key=lambda k: (sort_key(k[1]), k[0])):
            q1, q2 = second.get((mode, size, 1)), second.get((mode, size, 2))
            if not q1 or not q2:
                continue
            r = ratio(q2.median, q1.median)
            if mode == "node":
                worst_node.append(r)
            c1, c2 = cached.get((mode, size, 1)), cached.get((mode, size, 2))
            rows.append((size, mode, q1.n, _ms(q1.median), _ms(q2.median), f"{fmt(r, 2)}x",
                         fmt(c1.median if c1 else math.nan, 0),
                         fmt(c2.median if c2 else math.nan, 0)))
        lines.append(table(("size", "mode", "pairs", "Q1 TTFT", "Q2 TTFT", "Q2/Q1",
                            "Q1 cached tokens", "Q2 cached tokens"), rows))
        if worst_node and "second_ratio" in targets:
            checks.append(("node second-question TTFT / first (worst size)",
                           f"{fmt(max(worst_node), 2)}x (target <= {targets['second_ratio']}x)",
                           _check(max(worst_node) <= targets["second_ratio"])))

    lines += _cameras_section(samples)

    cb, ingest = extra.get("ingest_callback"), extra.get("ingest")
    if cb or ingest:
        lines += ["", "## Image ingest (1920x1080 rgb8, 30 Hz)", ""]
        rows = []
        if isinstance(cb, Mapping):
            rows.append(("node camera callback, in-process (median / p95 ms)",
                         f"{fmt(cb.get('median_ms'), 3)} / {fmt(cb.get('p95_ms'), 3)}"))
        if isinstance(ingest, Mapping):
            rows += [
                ("node process CPU, idle (%)", fmt(ingest.get("idle_cpu_percent"))),
                ("node process CPU, camera only (%)", fmt(ingest.get("camera_only_cpu_percent"))),
                ("node process CPU per frame above idle, camera only (ms)",
                 fmt(ingest.get("camera_only_cpu_ms_per_frame"), 3)),
                ("node process CPU, goals only (%)", fmt(ingest.get("goals_only_cpu_percent"))),
                ("node process CPU, camera + goals (%)",
                 fmt(ingest.get("camera_and_goals_cpu_percent"))),
                ("extra CPU per frame while goals run (ms; – when the goal load differed)",
                 fmt(_nonnegative(ingest.get("with_goals_extra_cpu_ms_per_frame")), 3)),
                ("goals/s without / with the camera",
                 f"{fmt(ingest.get('goals_per_s_without_camera'), 2)} / "
                 f"{fmt(ingest.get('goals_per_s_with_camera'), 2)}"),
            ]
        phases = extra.get("ingest_phases") or {}
        for name, ph in phases.items():
            rows.append((f"phase {name}: frames published / received, goals",
                         f"{ph.get('frames_published')} / {ph.get('frames_received')}, "
                         f"{ph.get('goals')}"))
        lines.append(table(("measure", "value"), rows))
        if isinstance(cb, Mapping) and "ingest_ms" in targets:
            checks.append(("camera callback per 1080p frame (median)",
                           f"{fmt(cb.get('median_ms'), 3)} ms (target <= "
                           f"{targets['ingest_ms']} ms)",
                           _check(cb.get("median_ms", math.inf) <= targets["ingest_ms"])))

    lifting = extra.get("lifting")
    if isinstance(lifting, Mapping) and lifting.get("rows"):
        lines += ["", f"## 3D lifting per goal (depth pick + {lifting.get('items')} boxes; "
                  f"depth off: {fmt(lifting.get('depth_off_ms'), 1)} ms, not called)", ""]
        rows = lifting["rows"]
        lines.append(table(("size", "boxes", "goals", "wall p50 ms", "wall p95 ms",
                            "thread CPU p50 ms", "valid"),
                           [(r["size"], r["boxes"], r["runs"], fmt(r["wall_p50_ms"], 3),
                             fmt(r["wall_p95_ms"], 3), fmt(r["cpu_p50_ms"], 3),
                             f"{r['valid']}/{lifting.get('items')}") for r in rows]))
        typical = [r for r in rows if r["size"] == "640x480" and r["boxes"] == "typical"]
        if typical:
            p50 = typical[0]["wall_p50_ms"]
            checks.append(("3D lifting per goal, 640x480, 10 boxes (p50)",
                           f"{fmt(p50, 3)} ms (target <= {lifting.get('target_p50_ms')} ms)",
                           _check(p50 <= lifting.get("target_p50_ms", math.inf))))

    mem = extra.get("memory")
    if isinstance(mem, Mapping):
        lines += ["", "## Memory (node process RSS)", ""]
        lines.append(table(("frames", "goals", "frame size", "RSS start MB", "RSS end MB",
                            "growth MB (after warm-up)"),
                           [(f"{mem.get('frames')}/{mem.get('frames_wanted')}",
                             f"{mem.get('goals')}/{mem.get('goals_wanted')}",
                             mem.get("frame_size"), fmt(mem.get("rss_start_mb")),
                             fmt(mem.get("rss_end_mb")), fmt(mem.get("rss_growth_mb")))]))
        if "rss_mb" in targets and mem.get("rss_growth_mb") is not None:
            checks.append(("node RSS growth", f"{fmt(mem['rss_growth_mb'])} MB (target <= "
                           f"{targets['rss_mb']:g} MB)",
                           _check(mem["rss_growth_mb"] <= targets["rss_mb"])))

    def prefill_only(rows: Iterable[Sample]) -> list[Sample]:
        # Runs from before the settings carry only prefill on/off.
        return [{"setting": "on" if s.get("prefill") else "off", **s} for s in rows
                if s.get("phase") == "prefill"]

    pre_samples = prefill_only(samples)
    pre = summarize(pre_samples, ("setting",), "ttft_s")
    pre_node = summarize(pre_samples, ("setting",), "node_ttft_s")  # transport left out
    pre_cached = summarize(pre_samples, ("setting",), "cached_prompt_tokens")
    pre_tput = throughput(prefill_only(data.get("batches", [])), ("setting",), phase="prefill")
    if pre or pre_tput:
        lines += ["", "## Goals on the latest frame of a 5 Hz camera: prefill on vs off", ""]
        rows = []
        settings = sorted({k[0] for k in (*pre, *pre_tput)},
                          key=lambda k: (k == "baseline", k != "off", k))
        for setting in settings:
            t, c, b = pre.get((setting,)), pre_cached.get((setting,)), pre_tput.get((setting,))
            n = pre_node.get((setting,))
            rows.append((setting, t.n if t else 0, _ms(t.median) if t else "–",
                         _ms(t.p95) if t else "–", _ms(n.median) if n else "–",
                         fmt(c.median if c else math.nan, 0),
                         b.n if b else 0, fmt(b.median if b else math.nan)))
        lines.append(table(("prefill", "goals", "TTFT p50 ms", "TTFT p95 ms",
                            "node TTFT p50 ms", "cached tokens p50", "8-goal batches",
                            "tok/s p50"), rows))
        lines.append("")
        lines.append("One goal at a time (short answer), then 8 goals at once (128 tokens each), "
                     "each at a random phase of the camera. Node TTFT: as the node measures it, "
                     "from the goal's start (the action transport left out). baseline: the "
                     "`baseline` mode's node fed by the same camera, asked about its latest "
                     "frame in the same rotation (the node against what users do today).")
        diag = extra.get("prefill_diagnostics")
        if diag:
            lines.append("")
            lines.append("Diagnostics: " + ", ".join(
                f"{k} {v.get('before')} -> {v.get('after')}" for k, v in diag.items()))
        lines += _prefill_phase_table(pre_samples)
        node_settings = [k for k in settings if k != "baseline"]
        for setting in node_settings[1:] if node_settings[:1] == ["off"] else ():
            on, off = pre.get((setting,)), pre.get(("off",))
            if on and off and "prefill_ttft_ratio" in targets:
                r = ratio(on.median, off.median)
                checks.append((f"goal TTFT on the latest frame, prefill {setting} / off",
                               f"{fmt(r, 2)}x (target <= {targets['prefill_ttft_ratio']:g}x)",
                               _check(r <= targets["prefill_ttft_ratio"])))
            on, off = pre_tput.get((setting,)), pre_tput.get(("off",))
            if on and off and "prefill_throughput_ratio" in targets:
                r = ratio(on.median, off.median)
                checks.append((f"8-goal throughput, prefill {setting} / off",
                               f"{fmt(r, 2)}x (target >= "
                               f"{targets['prefill_throughput_ratio']:g}x)",
                               _check(r >= targets["prefill_throughput_ratio"])))

        spread = pre_node.get(("on+ready",))
        if spread and spread.n >= 20 and "prefill_ttft_spread" in targets:
            r = ratio(spread.p95, spread.median)
            checks.append((f"node TTFT p95 / p50, prefill on+ready, camera streaming "
                           f"({spread.n} goals)",
                           f"{fmt(r, 2)}x (target <= {targets['prefill_ttft_spread']:g}x)",
                           _check(r <= targets["prefill_ttft_spread"])))

        base = pre.get(("baseline",))
        best = next((pre[(k,)] for k in ("on+ready", "on") if (k,) in pre), None)
        if base and best and "p2_ratio" in targets:
            r = ratio(base.median, best.median)
            checks.append(("P2: baseline TTFT / node's (prefill on+ready), latest frame of a "
                           "5 Hz camera", f"{fmt(r, 2)}x (target >= {targets['p2_ratio']:g}x)",
                           _check(r >= targets["p2_ratio"])))

    planning_lines, planning_checks = _planning_section(samples)
    lines += planning_lines
    checks += planning_checks

    fleet_lines, fleet_checks = _fleet_section(samples, extra.get("fleet") or {})
    lines += fleet_lines
    checks += fleet_checks

    if checks:
        lines += ["", "## Targets", ""]
        lines.append(table(("target", "measured", "result"), checks))
    failed = [s for s in samples if not s.get("ok")]
    if failed:
        lines += ["", f"## Failed requests: {len(failed)}", ""]
        seen: dict[str, int] = {}
        for s in failed:
            key = f"{s.get('phase')}/{s.get('mode')}: {str(s.get('error'))[:200]}"
            seen[key] = seen.get(key, 0) + 1
        lines += [f"- {n} x {k}" for k, n in list(seen.items())[:20]]
    lines.append("")
    return "\n".join(lines)


# The node's target over the transport floor, short answers: what the node adds to the engine
# beyond a bare rclpy action's round trip (node - engine - floor, per round), ms.
FLOOR_TARGET_MS = 1.0
ENGINE_AND_FLOOR = "engine+floor"  # the reference the node is judged against


def _short_latency(s: Sample) -> bool:
    return _latency_phase(s) and s.get("length") == "short"


def _engine_and_floor(samples: Sequence[Sample]) -> list[Sample]:
    """Per size and round where both succeeded: the engine's sample, with the floor's time added.

    The node is the engine's work plus the transport plus its own: against this reference the
    paired difference is the node's own cost above rclpy's bare action.
    """
    by_mode = group(samples, ("mode", "size", "round"), _short_latency)
    return [{**engine, "mode": ENGINE_AND_FLOOR,
             "e2e_s": engine["e2e_s"] + by_mode[("floor", size, r)][0]["e2e_s"]}
            for (mode, size, r), (engine, *_) in by_mode.items()
            if mode == "engine" and ("floor", size, r) in by_mode]


def floor_overhead(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """Return the floor, node - engine and node - engine - floor per size (short answers).

    All from the latency phase's rounds (ms). ``floor``: a bare rclpy action's round trip.
    ``node - engine``: paired per round, as the overhead table. ``node - engine - floor``:
    per round where all three succeeded, the node minus the engine minus the floor (the node
    cannot be faster than the engine's work plus rclpy's own action), its median, 95 %
    interval and the verdict against ``FLOOR_TARGET_MS``. Node and engine pairs must have
    generated the same number of tokens.
    """
    floor = summarize(samples, ("size",), "e2e_s", lambda s: _short_latency(s)
                      and s.get("mode") == "floor")
    over_engine = paired_overhead(samples, "node", "engine", "e2e_s", keys=("size",),
                                  where=_short_latency)
    above_floor = paired_overhead([*samples, *_engine_and_floor(samples)], "node",
                                  ENGINE_AND_FLOOR, "e2e_s", keys=("size",),
                                  where=_short_latency)
    rows = []
    for key in sorted(floor, key=lambda k: sort_key(k[0])):
        nan2 = [math.nan, math.nan]
        row = {"size": key[0], "floor_n": floor[key].n, "floor_p50_ms": 1e3 * floor[key].median,
               "floor_p95_ms": 1e3 * floor[key].p95, "engine_pairs": 0,
               "node_minus_engine_p50_ms": math.nan, "node_minus_engine_interval_ms": nan2,
               "pairs": 0, "above_floor_p50_ms": math.nan, "above_floor_interval_ms": nan2,
               "above_floor_p95_ms": math.nan, "verdict": decide([], FLOOR_TARGET_MS).text()}
        if key in over_engine:
            e, ed = over_engine[key]
            row.update(engine_pairs=ed.n, node_minus_engine_p50_ms=ed.median,
                       node_minus_engine_interval_ms=list(median_interval(e.deltas_ms)))
        if key in above_floor:
            a, ad = above_floor[key]
            row.update(pairs=ad.n, above_floor_p50_ms=ad.median, above_floor_p95_ms=ad.p95,
                       above_floor_interval_ms=list(median_interval(a.deltas_ms)),
                       verdict=decide(a.deltas_ms, FLOOR_TARGET_MS).text())
        rows.append(row)
    return rows


def _floor_section(samples: Sequence[Sample], floor: Mapping[str, Any]
                   ) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Render the floor beside node - engine, and the floor target's line per size."""
    rows = floor_overhead(samples)
    if not rows:
        return [], []
    result = f" ({floor['result_bytes']} bytes)" if floor.get("result_bytes") else ""
    lines = ["", "## Node over the transport floor (short answers, end to end, paired rounds)",
             "", "Floor: a bare rclpy action with the node's action type, QoS, executor and "
             "process layout, whose execute callback returns a node's short-answer result at "
             f"once{result}, asked in the same rotation as the node and the engine. Node - "
             "engine - floor: per round (same size) the node minus the engine minus the floor, "
             "what the node adds beyond the engine's work and rclpy's own action. Each "
             "difference: the median over rounds with its distribution-free 95 % interval.", ""]

    def interval(values: Sequence[float]) -> str:
        return " to ".join(fmt(v, 2) for v in values)

    lines.append(table(
        ("size", "floor n", "floor p50 ms", "floor p95 ms", "engine pairs",
         "node - engine p50 ms", "95 % interval ms", "pairs", "node - engine - floor p50 ms",
         "95 % interval ms", "p95 ms"),
        [(r["size"], r["floor_n"], fmt(r["floor_p50_ms"], 2), fmt(r["floor_p95_ms"], 2),
          r["engine_pairs"], fmt(r["node_minus_engine_p50_ms"], 2),
          interval(r["node_minus_engine_interval_ms"]), r["pairs"],
          fmt(r["above_floor_p50_ms"], 2), interval(r["above_floor_interval_ms"]),
          fmt(r["above_floor_p95_ms"], 2)) for r in rows]))
    checks = [(f"node - engine - floor at {r['size']}, short answers",
               f"{fmt(r['above_floor_p50_ms'], 2)} ms (target <= {FLOOR_TARGET_MS:g} ms)",
               r["verdict"]) for r in rows]
    return lines, checks


def _cameras_phase(s: Sample) -> bool:
    return s.get("phase") == "cameras"


def camera_cost(samples: Sequence[Sample]) -> dict[str, list[dict[str, Any]]]:
    """Return the cameras mode's figures (ms, medians unless named p95) as JSON-ready rows.

    ``settings``: per side (engine, node) and camera count, TTFT, end-to-end, prompt tokens
    and (node) preprocessing. ``second_camera``: per side, two cameras against one in the
    same round (TTFT and end-to-end deltas, TTFT ratio of the paired medians).
    ``node_overhead``: per camera count, node against engine in the same round, as the
    latency phase pairs them.
    """
    figures = {metric: summarize(samples, ("mode", "cameras"), metric, _cameras_phase)
               for metric in ("ttft_s", "e2e_s", "prompt_tokens", "node_preprocess_s")}
    settings = []
    for key in sorted(figures["e2e_s"], key=lambda k: (str(k[0]), sort_key(k[1]))):
        ttft, tokens, pre = (figures[m].get(key) for m in ("ttft_s", "prompt_tokens",
                                                           "node_preprocess_s"))
        settings.append({"mode": key[0], "cameras": key[1], "n": figures["e2e_s"][key].n,
                         "ttft_p50_ms": 1e3 * ttft.median if ttft else math.nan,
                         "ttft_p95_ms": 1e3 * ttft.p95 if ttft else math.nan,
                         "e2e_p50_ms": 1e3 * figures["e2e_s"][key].median,
                         "prompt_tokens_p50": tokens.median if tokens else math.nan,
                         "preprocess_p50_ms": 1e3 * pre.median if pre else math.nan})
    ttft_cost = paired_overhead(samples, 2, 1, "ttft_s", keys=("mode",), where=_cameras_phase,
                                by="cameras")
    e2e_cost = paired_overhead(samples, 2, 1, "e2e_s", keys=("mode",), where=_cameras_phase,
                               by="cameras")
    second = []
    for key in sorted(ttft_cost, key=lambda k: str(k[0])):
        (o, d), e2e = ttft_cost[key], e2e_cost.get(key)
        second.append({"mode": key[0], "pairs": d.n, "ttft_one_p50_ms": o.reference_ms,
                       "ttft_two_p50_ms": o.mode_ms, "ttft_delta_p50_ms": d.median,
                       "ttft_ratio": ratio(o.mode_ms, o.reference_ms),
                       "e2e_delta_p50_ms": e2e[1].median if e2e else math.nan})
    e2e_over = paired_overhead(samples, "node", "engine", "e2e_s", keys=("cameras",),
                               where=_cameras_phase)
    ttft_over = paired_overhead(samples, "node", "engine", "ttft_s", keys=("cameras",),
                                where=_cameras_phase)
    overhead = []
    for key in sorted(e2e_over, key=lambda k: sort_key(k[0])):
        (o, d), t = e2e_over[key], ttft_over.get(key)
        overhead.append({"cameras": key[0], "pairs": d.n, "engine_e2e_p50_ms": o.reference_ms,
                         "node_e2e_p50_ms": o.mode_ms, "overhead_p50_ms": d.median,
                         "overhead_p95_ms": d.p95,
                         "ttft_overhead_p50_ms": t[1].median if t else math.nan})
    return {"settings": settings, "second_camera": second, "node_overhead": overhead}


def _cameras_section(samples: Sequence[Sample]) -> list[str]:
    """Render the cameras mode's tables (none when the run has no such samples)."""
    cost = camera_cost(samples)
    if not cost["settings"]:
        return []
    first = next(s for s in samples if _cameras_phase(s))
    lines = ["", f"## Second camera: front {first.get('size')} + wrist "
             f"{first.get('wrist_size')} (short answers; ms, medians)", ""]
    lines.append(table(("side", "cameras", "n", "TTFT p50", "TTFT p95", "e2e p50",
                        "prompt tokens", "node preprocess"),
                       [(r["mode"], r["cameras"], r["n"], fmt(r["ttft_p50_ms"]),
                         fmt(r["ttft_p95_ms"]), fmt(r["e2e_p50_ms"]),
                         fmt(r["prompt_tokens_p50"], 0), fmt(r["preprocess_p50_ms"]))
                        for r in cost["settings"]]))
    if cost["second_camera"]:
        lines += ["", "What the second camera adds: two cameras minus one, rounds paired (each "
                  "round asks both ways about fresh pictures).", ""]
        lines.append(table(("side", "pairs", "TTFT one", "TTFT two", "TTFT delta p50",
                            "TTFT two/one", "e2e delta p50"),
                           [(r["mode"], r["pairs"], fmt(r["ttft_one_p50_ms"]),
                             fmt(r["ttft_two_p50_ms"]), fmt(r["ttft_delta_p50_ms"]),
                             f"{fmt(r['ttft_ratio'], 2)}x", fmt(r["e2e_delta_p50_ms"]))
                            for r in cost["second_camera"]]))
    if cost["node_overhead"]:
        lines += ["", "Node overhead over the bare engine per setting: node minus engine on "
                  "the same pictures, rounds paired as in the latency tables.", ""]
        lines.append(table(("cameras", "pairs", "engine e2e p50", "node e2e p50",
                            "overhead p50", "overhead p95", "TTFT overhead p50"),
                           [(r["cameras"], r["pairs"], fmt(r["engine_e2e_p50_ms"]),
                             fmt(r["node_e2e_p50_ms"]), fmt(r["overhead_p50_ms"]),
                             fmt(r["overhead_p95_ms"]), fmt(r["ttft_overhead_p50_ms"]))
                            for r in cost["node_overhead"]]))
    return lines


# The planning mode's target: a running behaviour's tick (median), microseconds.
PLANNING_TICK_TARGET_US = 100.0


def _planning_phase(s: Sample) -> bool:
    return s.get("phase") == "planning"


def planning_cost(samples: Sequence[Sample]) -> dict[str, Any]:
    """Return the planning mode's figures as JSON-ready values.

    ``behaviour``: per behaviour run (one goal, ticked until it ended) the median running
    tick; their median over the runs, its 95 % interval, and the runs' median p95, worst
    tick, thread CPU, and the first (submit) and last (result) ticks. ``mcp_overhead``: per
    tool, the tool call minus the action goal it wraps, rounds paired (ms).
    """
    runs = group(samples, ("mode",), _planning_phase).get(("behaviour",), [])

    def of(key: str) -> list[float]:
        return [float(s[key]) for s in runs if s.get(key) is not None]

    low, high = median_interval(of("tick_p50_us"))
    behaviour = {"runs": len(runs), "ticks": sum(int(s.get("ticks") or 0) for s in runs),
                 "tick_p50_us": median(of("tick_p50_us")), "tick_p50_interval_us": [low, high],
                 "tick_p95_us": median(of("tick_p95_us")),
                 "tick_max_us": max(of("tick_max_us"), default=math.nan),
                 "tick_cpu_p50_us": median(of("tick_cpu_p50_us")),
                 "submit_tick_p50_us": median(of("submit_tick_us")),
                 "result_tick_p50_us": median(of("result_tick_us")),
                 "target_us": PLANNING_TICK_TARGET_US}
    # Output lengths are fixed by the node (limits.fixed_output_length), and the tool's
    # result does not carry them: pairs are not matched on output tokens.
    over = paired_overhead(samples, "mcp", "action", "e2e_s", keys=("tool",),
                           where=_planning_phase, same=None)
    tools = []
    for (tool,), (o, d) in sorted(over.items(), key=lambda kv: str(kv[0][0])):
        low, high = median_interval(o.deltas_ms)
        tools.append({"tool": tool, "pairs": d.n, "action_p50_ms": o.reference_ms,
                      "mcp_p50_ms": o.mode_ms, "overhead_p50_ms": d.median,
                      "overhead_interval_ms": [low, high], "overhead_p95_ms": d.p95})
    return {"behaviour": behaviour, "mcp_overhead": tools}


def _planning_section(samples: Sequence[Sample]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Render the planning mode's tables and the tick target's line (none without samples)."""
    cost = planning_cost(samples)
    b = cost["behaviour"]
    if not b["runs"] and not cost["mcp_overhead"]:
        return [], []
    lines = ["", "## Planners: a behaviour's tick, and an MCP tool call over its action goal", ""]
    checks = []
    if b["runs"]:
        low, high = b["tick_p50_interval_us"]
        lines.append(table(
            ("behaviour runs", "running ticks", "tick p50 µs", "95 % interval µs",
             "tick p95 µs", "worst tick µs", "thread CPU p50 µs", "submit tick µs",
             "result tick µs"),
            [(b["runs"], b["ticks"], fmt(b["tick_p50_us"]), f"{fmt(low)} to {fmt(high)}",
              fmt(b["tick_p95_us"]), fmt(b["tick_max_us"]), fmt(b["tick_cpu_p50_us"]),
              fmt(b["submit_tick_p50_us"]), fmt(b["result_tick_p50_us"]))]))
        lines += ["", "A py_trees `Ask` ticked every few ms while its goal generates: per run "
                  "the median of its running ticks (p50 and interval: over the runs; p95: the "
                  "runs' median p95). Submit: the first tick (sends the goal); result: the "
                  "last (reads the result, writes the blackboard)."]
        runs = group(samples, ("mode",), _planning_phase).get(("behaviour",), [])
        decision = decide([float(s["tick_p50_us"]) for s in runs], b["target_us"])
        checks.append(("running behaviour's tick (median)",
                       f"{fmt(b['tick_p50_us'])} µs (target <= {b['target_us']:g} µs)",
                       # One value per behaviour run, not a pair of runs.
                       decision.text("µs").replace(" pairs", " runs")))
    if cost["mcp_overhead"]:
        lines.append("")
        lines.append(table(("tool", "pairs", "action goal p50 ms", "tool call p50 ms",
                            "overhead p50 ms", "95 % interval ms", "overhead p95 ms"),
                           [(r["tool"], r["pairs"], fmt(r["action_p50_ms"]),
                             fmt(r["mcp_p50_ms"]), fmt(r["overhead_p50_ms"], 2),
                             " to ".join(fmt(v, 2) for v in r["overhead_interval_ms"]),
                             fmt(r["overhead_p95_ms"], 2)) for r in cost["mcp_overhead"]]))
        lines += ["", "Overhead: the tool call (the SDK's client, end to end) minus the same "
                  "goal sent directly through `ReasonClient`, each on a fresh frame, in "
                  "alternating order, per round."]
    return lines, checks


def fleet_hit_rates(samples: Iterable[Sample]) -> dict[tuple[Any, ...], float]:
    """Return the prefix-cache hit rate per (policy, question) and (policy, "all").

    Summed cached prompt tokens over summed prompt tokens of the fleet phase's measured goals.
    """
    sums: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key, rows in group(samples, ("policy", "question"),
                           lambda s: s.get("phase") == "fleet").items():
        for s in rows:
            for k in (key, (key[0], "all")):
                sums[k][0] += s.get("cached_prompt_tokens") or 0
                sums[k][1] += s.get("prompt_tokens") or 0
    return {k: ratio(c, t) for k, (c, t) in sums.items()}


def _fleet_section(samples: Sequence[Sample], fleet: Mapping[str, Any]
                   ) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Render the fleet mode's table (one row per router policy) and its target line."""
    def where(s: Sample) -> bool:
        return s.get("phase") == "fleet"

    ttft = summarize(samples, ("policy",), "node_ttft_s", where)
    if not ttft:
        return [], []
    by_q = summarize(samples, ("policy", "question"), "node_ttft_s", where)
    client = summarize(samples, ("policy",), "ttft_s", where)
    hits = fleet_hit_rates(samples)
    requests = fleet.get("requests_per_backend") or {}
    lines = ["", f"## Fleet: {fleet.get('robots_per_policy', '?')} robots per policy on two "
             f"`vllm serve` through `vllm-router`, one router per policy", ""]
    rows = []
    for (policy,), t in sorted(ttft.items(), key=lambda kv: str(kv[0][0])):
        q1, q2 = by_q.get((policy, 1)), by_q.get((policy, 2))
        c = client.get((policy,))
        per_backend = requests.get(policy) or {}
        rows.append((policy, t.n, _ms(t.median), _ms(t.p95),
                     _ms(q1.median if q1 else math.nan), _ms(q2.median if q2 else math.nan),
                     _ms(c.median if c else math.nan),
                     fmt(100 * hits.get((policy, 1), math.nan)),
                     fmt(100 * hits.get((policy, 2), math.nan)),
                     fmt(100 * hits.get((policy, "all"), math.nan)),
                     " / ".join(fmt(v, 0) for _, v in sorted(per_backend.items())) or "–"))
    lines.append(table(("policy", "goals", "TTFT p50 ms", "TTFT p95 ms", "Q1 TTFT p50",
                        "Q2 TTFT p50", "client TTFT p50", "Q1 hit %", "Q2 hit %", "hit %",
                        "requests per backend"), rows))
    lines += ["", "TTFT: the result's time_to_first_token_s (the node's, from the goal's start). "
              "Hit %: cached prompt tokens / prompt tokens summed over the goals (Q1: a goal "
              "on the latest frame of a camera at "
              f"{fmt(fleet.get('camera_hz', math.nan), 1)} Hz with prefill on; Q2: the "
              "follow-up on the same frame). Requests per backend: the policy's router's own "
              "counter over the measured rounds, prefills included."]
    metrics = fleet.get("backend_metrics") or {}
    if metrics:
        lines.append("")
        lines.append("Backends over the measured rounds (both policies): " + "; ".join(
            f"{b}: {fmt(m.get('vllm:request_success_total', math.nan), 0)} requests, prefix "
            f"cache {fmt(m.get('vllm:prefix_cache_hits_total', math.nan), 0)} / "
            f"{fmt(m.get('vllm:prefix_cache_queries_total', math.nan), 0)} tokens hit"
            for b, m in sorted(metrics.items())))
    affinity, rr = hits.get(("affinity", "all")), hits.get(("round_robin", "all"))
    checks = []
    if affinity is not None and rr is not None:
        checks.append(("fleet prefix-cache hit rate, affinity vs round robin",
                       f"{fmt(100 * affinity)} % vs {fmt(100 * rr)} % (target: affinity "
                       f"higher)", _check(affinity > rr)))
    return lines, checks
