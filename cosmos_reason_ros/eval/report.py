"""The replay report: one HTML page, a latency histogram and annotated frames (PNG).

The page has a summary table and, per query, the annotated frame, the answer, the reasoning
and the scores. Geometry scores get their own column: the best IoU of each ``box_iou`` and
the 3D error (metres) of each ``position_error``; with depth, each box lists its lifted 3D
position and the result its lift code.

Inputs are the replay's records (the same dicts as its JSONL lines). Frames are drawn with
``core.annotate`` (the node's own ``~/annotated_image`` drawing): the model's boxes, points
and trajectories in colour, the recording's ground truth (when it has one) in thin white.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np

from cosmos_reason_ros.core.annotate import draw_annotations
from cosmos_reason_ros.core.stats import percentile
from cosmos_reason_ros.core.types import ErrorCode

FRAMES_DIR = "frames"
MAX_TEXT = 4000  # characters of answer/reasoning shown per query
LIFT_NAMES = ("LIFT_OFF", "LIFT_OK", "LIFT_NO_DEPTH", "LIFT_BAD_DEPTH", "LIFT_TF_FAILED")


def _ns(obj: Any) -> Any:
    """Dicts (and lists of dicts) as attribute objects, as ``draw_annotations`` reads them."""
    if isinstance(obj, Mapping):
        return SimpleNamespace(**{k: _ns(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [_ns(v) for v in obj]
    return math.nan if obj is None else obj


def annotate_frame(rgb: np.ndarray, record: Mapping[str, Any]) -> np.ndarray:
    """Draw the ground truth (thin white) and the result's geometry drawn."""
    out = np.array(rgb, copy=True)
    for label, box in (record.get("ground_truth") or {}).items():
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        cv2.rectangle(out, (x0, y0), (x1, y1), (255, 255, 255), 1)
        cv2.putText(out, f"gt: {label}", (x0, min(out.shape[0] - 4, y1 + 14)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1, cv2.LINE_AA)
    result = record["result"]
    # A multi-camera result is drawn on its first camera's frame: that camera's items only.
    frames = result.get("camera_frames") or []
    camera = frames[0]["camera"] if frames else ""

    def drawn(items: Sequence[Mapping[str, Any]]) -> Any:
        return _ns([i for i in items if not camera or i.get("camera", camera) == camera])

    return draw_annotations(out, drawn(result.get("boxes", [])), drawn(result.get("points", [])),
                            drawn(result.get("trajectories", [])),
                            title=f"{record['query']}: {result.get('answer', '')}")


def frame_name(index: int, record: Mapping[str, Any]) -> str:
    """File name of a record's annotated frame (relative to the report directory)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in record["query"])[:40]
    return f"{FRAMES_DIR}/{index:04d}_{safe}_{record['occurrence']}.png"


def write_frame(out_dir: Path, index: int, record: Mapping[str, Any], rgb: np.ndarray) -> str:
    """Write one annotated frame PNG; return its relative path."""
    name = frame_name(index, record)
    path = out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(annotate_frame(rgb, record), cv2.COLOR_RGB2BGR))
    return name


def latency_histogram(records: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Histogram of total and time-to-first-token latencies (PNG); False when no data."""
    ok = [r["result"] for r in records if r["result"].get("error_code") == ErrorCode.OK]
    if not ok:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = [1000 * r["total_s"] for r in ok]
    ttft = [1000 * r["time_to_first_token_s"] for r in ok]
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    bins = np.histogram_bin_edges(total + ttft, bins=min(30, max(5, len(ok))))
    ax.hist(total, bins=bins, alpha=0.7, label="total")
    ax.hist(ttft, bins=bins, alpha=0.7, label="time to first token")
    ax.set_xlabel("ms")
    ax.set_ylabel("queries")
    ax.legend()
    ax.set_title(f"latency over {len(ok)} successful queries")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def code_name(code: int) -> str:
    """``ErrorCode`` name of a result's error code (the number if unknown)."""
    return ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)


def _e(text: Any) -> str:
    return html.escape(str(text))


def geometry_scores(record: Mapping[str, Any]) -> str:
    """Return the record's IoU and 3D-error figures, e.g. ``red box: IoU 0.41, 0.027 m``."""
    parts: dict[str, list[str]] = {}
    for s in record.get("scores", ()):
        value = s.get("value")
        if s["kind"] == "box_iou":
            shown = "IoU n/a" if value is None else f"IoU {value:.2f}"
        elif s["kind"] == "position_error":
            shown = "3D n/a" if value is None else f"{value:.3f} m"
        else:
            continue
        parts.setdefault(s.get("label") or "?", []).append(shown)
    return "; ".join(f"{label}: {', '.join(v)}" for label, v in parts.items())


def position_errors(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """Every 3D error (metres) that the records' ``position_error`` scores measured."""
    return [s["value"] for r in records for s in r.get("scores", ())
            if s["kind"] == "position_error" and s.get("value") is not None]


def _lift_name(code: int) -> str:
    return LIFT_NAMES[code] if 0 <= code < len(LIFT_NAMES) else str(code)


def _box_line(b: Mapping[str, Any]) -> str:
    text = (f"{_e(b['label'])}: ({b['x_min']:.0f}, {b['y_min']:.0f}) - "
            f"({b['x_max']:.0f}, {b['y_max']:.0f})")
    p3 = b.get("position_3d") or {}
    pos = p3.get("position") or {}
    if p3.get("valid") and None not in (pos.get("x"), pos.get("y"), pos.get("z")):
        text += f" &rarr; 3D ({pos['x']:.3f}, {pos['y']:.3f}, {pos['z']:.3f}) m"
    elif p3.get("status"):
        text += f" &rarr; no 3D: {_e(p3['status'])}"
    return f"<li>{text}</li>"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " [...]"


def write_report(out_dir: Path, records: Sequence[Mapping[str, Any]],
                 frames: Mapping[int, str], meta: Mapping[str, Any],
                 summary: Mapping[str, Any]) -> Path:
    """Write ``report.html`` (and ``latency.png``) into ``out_dir``; return the HTML path.

    ``frames`` maps a record index to its annotated frame PNG (relative path).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    has_hist = latency_histogram(records, out_dir / "latency.png")
    ok = [r["result"] for r in records if r["result"].get("error_code") == ErrorCode.OK]
    totals = [r["total_s"] for r in ok]
    ttfts = [r["time_to_first_token_s"] for r in ok]
    errors_3d = position_errors(records)
    verdict = "PASS" if summary.get("ok") else "REGRESSION"
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in (
        *meta.items(), *((k, v) for k, v in summary.items() if k != "ok"),
        ("total p50 / p95 (ms)", f"{1000 * percentile(totals, 50):.0f} / "
                                 f"{1000 * percentile(totals, 95):.0f}"),
        ("ttft p50 / p95 (ms)", f"{1000 * percentile(ttfts, 50):.0f} / "
                                f"{1000 * percentile(ttfts, 95):.0f}"),
        *((("3D error p50 / max (m)", f"{percentile(errors_3d, 50):.3f} / "
                                      f"{max(errors_3d):.3f} over {len(errors_3d)}"),)
          if errors_3d else ())))
    table = []
    for i, r in enumerate(records):
        res = r["result"]
        code = res.get("error_code", 0)
        status = r["status"] if code == ErrorCode.OK else f"{r['status']} ({code_name(code)})"
        scores = ", ".join(("pass" if s["passed"] else "FAIL") + f" {s['kind']}"
                           + (" (info)" if s["informational"] else "") for s in r["scores"])
        cls = ' class="bad"' if r.get("regression") else ""
        table.append(f"<tr{cls}><td><a href='#q{i}'>{_e(r['query'])}#{r['occurrence']}</a></td>"
                     f"<td>{r['t_s']:.2f}</td><td>{_e(status)}</td>"
                     f"<td>{_e(res.get('answer', '')[:80])}</td>"
                     f"<td>{1000 * res.get('total_s', 0.0):.0f}</td>"
                     f"<td>{_e(geometry_scores(r))}</td><td>{_e(scores)}</td></tr>")
    details = []
    for i, r in enumerate(records):
        res = r["result"]
        img = f"<img src='{_e(frames[i])}' alt='frame'>" if i in frames else \
            "<p><i>no frame (the goal failed before choosing one)</i></p>"
        score_items = "".join(
            f"<li class='{'ok' if s['passed'] else ('info' if s['informational'] else 'bad')}'>"
            f"{_e(s['kind'])}: {_e(s['reason'])}</li>" for s in r["scores"])
        boxes = "".join(_box_line(b) for b in res.get("boxes", []))
        lift = int(res.get("lift_code", 0))
        lift_text = "" if not lift else (
            f"{_lift_name(lift)} in {res.get('frame_3d', '')!r}"
            + (f": {res['lift_message']}" if res.get("lift_message") else ""))
        details.append(
            f"<section id='q{i}'><h3>{_e(r['query'])}#{r['occurrence']} at {r['t_s']:.2f} s "
            f"&mdash; {_e(r['status'])}</h3>{img}<dl>"
            f"<dt>task / prompt</dt><dd>{_e(res.get('task', ''))}: {_e(res.get('prompt', ''))}</dd>"
            f"<dt>answer</dt><dd><pre>{_e(_clip(res.get('answer', '')))}</pre></dd>"
            + (f"<dt>answer JSON</dt><dd><pre>{_e(_clip(res['answer_json']))}</pre></dd>"
               if res.get("answer_json") else "")
            + (f"<dt>boxes</dt><dd><ul>{boxes}</ul></dd>" if boxes else "")
            + (f"<dt>3D</dt><dd>{_e(lift_text)}</dd>" if lift_text else "")
            + (f"<dt>error</dt><dd>{_e(res.get('error_message', ''))}</dd>"
               if res.get("error_code") else "")
            + f"<dt>timing</dt><dd>ttft {1000 * res.get('time_to_first_token_s', 0):.0f} ms, "
              f"total {1000 * res.get('total_s', 0):.0f} ms, tokens "
              f"{res.get('prompt_tokens', 0)}+{res.get('output_tokens', 0)}</dd>"
            + (f"<dt>scores</dt><dd><ul>{score_items}</ul></dd>" if score_items else "")
            + "</dl>"
            + (f"<details><summary>reasoning</summary><pre>{_e(_clip(res['reasoning']))}</pre>"
               f"</details>" if res.get("reasoning") else "")
            + "</section>")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>replay: {_e(meta.get('scenario', ''))}</title><style>
body{{font-family:sans-serif;margin:2em;max-width:1100px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}}
tr.bad td{{background:#fdd}} li.bad{{color:#b00}} li.ok{{color:#070}} li.info{{color:#a60}}
img{{max-width:100%}} pre{{white-space:pre-wrap;margin:0}} section{{border-top:1px solid #999}}
</style></head><body>
<h1>replay: {_e(meta.get('scenario', ''))} &mdash; {verdict}</h1>
<table>{rows}</table>
{"<p><img src='latency.png' alt='latency histogram'></p>" if has_hist else ""}
<h2>queries</h2><table><tr><th>query</th><th>t (s)</th><th>status</th><th>answer</th>
<th>total (ms)</th><th>IoU / 3D error</th><th>scores</th></tr>{"".join(table)}</table>
{"".join(details)}
</body></html>
"""
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
