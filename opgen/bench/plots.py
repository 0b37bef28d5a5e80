"""The benchmarks' one chart: each case's time per candidate as a ratio to eager, as grouped bars (`--png`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def ratio_bars(
    ratios: Mapping[tuple[str, str], float],
    cases: Sequence[str],
    candidates: Sequence[str],
    labels: Mapping[str, str],
    path: Path,
    *,
    ylabel: str,
    title: str,
    rotation: int = 0,
) -> str:
    """Write a bar chart of `ratios[case, candidate]` (log scale, 1.0 marked) to `path`; the line to print."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--png: matplotlib is not installed (pip install matplotlib); {path} not written"
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    width = 0.8 / len(candidates)
    for i, cand in enumerate(candidates):
        xs = [j + i * width for j, case in enumerate(cases) if (case, cand) in ratios]
        ax.bar(xs, [ratios[case, cand] for case in cases if (case, cand) in ratios], width, label=labels[cand])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, rotation=rotation)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"wrote {path}"
