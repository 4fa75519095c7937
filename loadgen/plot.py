"""``--plot out.png``: latency CDFs (TTFT, E2E) per class and goodput per class.

matplotlib is an optional extra (``pip install 'berth[plot]'``); without it the CLI says so and writes
the JSON report anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.report import Report


class PlotUnavailable(RuntimeError):
    pass


def plot_report(report: Report, path: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed (pip install 'berth[plot]')"
        ) from None
    classes = sorted({r.cls for r in report.requests})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, attr, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "e2e_s", "E2E")):
        for cls in classes:
            values = sorted(
                getattr(r, attr) * 1000.0
                for r in report.requests
                if r.cls == cls and r.ok and getattr(r, attr)
            )
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=cls)
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    stats: dict[str, Any] = report.data["classes"]
    names = list(stats)
    axes[2].bar(names, [stats[n]["goodput"] or 0.0 for n in names])
    axes[2].set_ylim(0, 1)
    axes[2].set_title("goodput per class")
    axes[2].tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
