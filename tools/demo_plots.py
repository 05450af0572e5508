"""The main job's plots (tools/demo.py): speed-up per stage, and each loss curve against
one process.

Why a module of its own: every picture must explain itself when shown alone (in
docs/demo/, a pull request, a slide), so each carries a title, the rank count, the sizes
it ran at and the torch release; that labelling is kept here, apart from running stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class RunInfo:
    """What every plot states about the run it comes from."""

    ranks: int
    backend: str  # the process group's: gloo (CPU) or nccl
    size: str  # the demo's --size
    torch: str

    def caption(self) -> str:
        return f"{self.ranks} ranks ({self.backend}), size {self.size}, torch {self.torch}"


def plot(rows: list[Row], out: Path, run: RunInfo) -> list[Path]:
    """speedup.png and loss-<stage>.png in `out`; nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return []
    done = [(p, r) for p, r in rows if r.get("time_s") and "error" not in r]
    timed = [(p, r) for p, r in done if r.get("baseline_time_s")]
    written = []
    if timed:
        written.append(speedup(timed, out / "speedup.png", run))
    for package, r in done:
        if r.get("loss_curve"):
            path = out / f"loss-{package.replace(' ', '-')}.png"
            written.append(loss_curve(package, r, path, run))
    return written


def speedup(timed: list[Row], path: Path, run: RunInfo) -> Path:
    """One bar per stage: time without the plugin over time with it, labelled with the
    stage's size and its error against one process."""
    import matplotlib.pyplot as plt

    rows = timed[::-1]  # first stage on top
    ratios = [r["baseline_time_s"] / r["time_s"] for _, r in rows]
    labels = [f"{p}\n{r['size']}" if r.get("size") else p for p, r in rows]
    fig, ax = plt.subplots(figsize=(7.2, 1.3 + 0.62 * len(rows)), layout="constrained")
    bars = ax.barh(labels, ratios, color=["#3b7dd8" if x >= 1 else "#d8823b" for x in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    for bar, (_, r) in zip(bars, rows, strict=True):
        ax.annotate(
            f"{bar.get_width():.2f}x  (max err {r['max_error']:.0e})",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, max(max(ratios), 1.0) * 1.35)  # room for the labels, no more
    ax.set_xlabel("speed-up: time without the plugin / time with it (same run)")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(f"Each plugin against doing without it\n{run.caption()}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_curve(package: str, r: dict[str, Any], path: Path, run: RunInfo) -> Path:
    """The sharded run's loss per step drawn over the one-process run's: they coincide."""
    import matplotlib.pyplot as plt

    curve = r["loss_curve"]
    steps = range(1, len(curve["reference"]) + 1)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    ax.plot(steps, curve["reference"], "-", color="#bbbbbb", linewidth=6, label="one process")
    ax.plot(steps, curve["sharded"], "o--", color="#3b7dd8", markersize=4, label=curve["label"])
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    ax.legend(title=f"max difference {r['max_error']:.1e}", fontsize=8, title_fontsize=8)
    sizes = f"\n{r['size']}" if r.get("size") else ""
    ax.set_title(f"{package}: {r['feature']}{sizes}\n{run.caption()}", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
