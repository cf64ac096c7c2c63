"""PNG plots of one scenario's result: window size, acceptance and round latency over time, per policy."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("window.png", "mean window k", [("mean_k", "-")]),
    ("acceptance.png", "acceptance (accepted / drafted)", [("acceptance", "-")]),
    ("latency.png", "round latency, ms (solid p50, dashed p99)", [("p50_ms", "-"), ("p99_ms", "--")]),
)


def write_plots(result: dict, out: Path) -> list[Path]:
    paths = []
    for filename, ylabel, lines in PANELS:
        fig, ax = plt.subplots(figsize=(8, 4))
        for i, (policy, summary) in enumerate(result["policies"].items()):
            series = summary["series"]
            color = f"C{i % 10}"
            for key, style in lines:
                points = [(t, v) for t, v in zip(series["t"], series[key]) if v is not None]
                if points:
                    ax.plot(*zip(*points), style, color=color, label=policy if style == "-" else None)
        ax.set_xlabel("simulated time, s")
        ax.set_ylabel(ylabel)
        ax.set_title(result["name"])
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        path = out / filename
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
