"""``--plot out.png``: latency CDFs (TTFT, E2E) per class and goodput per class; a simulation's plot adds
the fleet over time (queue depth, utilization).

matplotlib is an optional extra (``pip install 'berth-gateway[plot]'``); without it the CLI says so and writes
the JSON report anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.report import Report


class PlotUnavailable(RuntimeError):
    pass


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed (pip install 'berth-gateway[plot]')"
        ) from None
    return plt


def plot_report(report: Report, path: str | Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    _draw_latency_and_goodput(report, axes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_simulation(report: Report, path: str | Path) -> None:
    """The run's latency CDFs and goodput, and the fleet over time: berth's queue and the engines'
    running / waiting requests, and the share of endpoints busy."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    _draw_latency_and_goodput(report, axes[0])
    tl = report.data["fleet"]["timeline"]
    t = tl["t_s"]
    ax = axes[1][0]
    ax.plot(t, tl["gateway_queued"], label="queued in berth")
    ax.plot(t, tl["engine_waiting"], label="waiting in engines")
    ax.plot(t, tl["engine_running"], label="running in engines")
    ax.set_title("requests over time")
    ax.set_xlabel("simulated s")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    n = max(1, report.data["fleet"]["endpoints"])
    ax = axes[1][1]
    ax.plot(t, [b / n for b in tl["busy_endpoints"]])
    ax.set_ylim(0, 1.05)
    ax.set_title("utilization (share of endpoints busy)")
    ax.set_xlabel("simulated s")
    ax.grid(True, alpha=0.3)
    axes[1][2].axis("off")
    lines = [f"{k}: {v}" for k, v in report.data["simulation"].items() if k != "left_out"]
    axes[1][2].text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _draw_latency_and_goodput(report: Report, axes: Any) -> None:
    classes = sorted({r.cls for r in report.requests})
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
