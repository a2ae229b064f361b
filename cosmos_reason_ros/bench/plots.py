"""The bench's PNG plots: latency per size and length, throughput, node RSS."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cosmos_reason_ros.bench import report as benchreport
from cosmos_reason_ros.bench import stats as benchstats
from cosmos_reason_ros.bench.workload import LENGTHS


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
                       key=lambda c: (benchreport.sort_key(c[0]), LENGTHS.get(c[1], 0)))
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
