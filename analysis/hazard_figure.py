"""The hazard map's figures (matplotlib, Agg): ``map.png`` and ``km.png``.

- ``map.png``: the share collapsed by H as a heat map, dose (rows, ascending upwards) x lr (columns, ascending),
  each cell annotated ``k/n`` (events / runs), the cell the rule chose outlined; a missing cell is blank.
- ``km.png``: Kaplan-Meier curves (:func:`analysis.survival.kaplan_meier`), one panel per lr, one step line per
  dose (the no-noise control black and dashed, the doses shaded from light to dark along a sequential colour map), each
  drawn to H, where every run still standing is censored.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from .survival import kaplan_meier  # noqa: E402

CONTROL = (0.0, 0.0, 0.0)


def _dose_label(dose: float) -> str:
    return "0 (no noise)" if dose == 0 else f"{dose:g}"


def dose_colours(doses) -> dict[float, tuple]:
    """Black for dose 0, then light to dark along ``viridis_r``'s middle for the positive doses."""
    pos = sorted(d for d in set(doses) if d > 0)
    cmap = plt.get_cmap("viridis_r")
    out = {0.0: CONTROL}
    for i, d in enumerate(pos):
        out[d] = cmap(0.15 + 0.75 * (i / max(len(pos) - 1, 1)))[:3]
    return out


def map_figure(cells: pd.DataFrame, rule, horizon: float, path: Path, dpi: int = 100) -> Path:
    doses, lrs = sorted(cells["dose"].unique()), sorted(cells["lr"].unique())
    share = np.full((len(doses), len(lrs)), np.nan)
    fig = Figure(figsize=(1.6 + 1.3 * len(lrs), 1.2 + 0.75 * len(doses)))
    ax = fig.add_subplot(1, 1, 1)
    for r in cells.itertuples():
        share[doses.index(r.dose), lrs.index(r.lr)] = r.share
    im = ax.imshow(share, origin="lower", cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto")
    for r in cells.itertuples():
        i, j = doses.index(r.dose), lrs.index(r.lr)
        ax.text(j, i, f"{int(r.events)}/{int(r.runs)}", ha="center", va="center", fontsize=10,
                color="white" if r.share > 0.6 else "black")
    if rule.chosen is not None:
        i, j = doses.index(rule.chosen[0]), lrs.index(rule.chosen[1])
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2.5, ec="tab:blue"))
    ax.set_xticks(range(len(lrs)), [f"{x:g}" for x in lrs])
    ax.set_yticks(range(len(doses)), [_dose_label(d) for d in doses])
    ax.set_xlabel("learning rate (trainer.lr)")
    ax.set_ylabel("dose: k3 target (inference.kl_target)")
    chosen = "\noutlined: the cell the rule chose" if rule.chosen is not None else "\nno cell qualifies"
    ax.set_title(f"share collapsed by step {horizon:g} (events/runs){chosen}", fontsize=9)
    fig.colorbar(im, ax=ax, label="share collapsed")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def km_figure(runs: pd.DataFrame, horizon: float, path: Path, dpi: int = 100) -> Path:
    lrs = sorted(runs["lr"].unique())
    colours = dose_colours(runs["dose"])
    fig = Figure(figsize=(3.4 * len(lrs) + 1.6, 3.4))
    axes = fig.subplots(1, len(lrs), sharey=True, squeeze=False)[0]
    for ax, lr in zip(axes, lrs):
        at = runs[runs["lr"] == lr]
        for dose, g in at.groupby("dose", sort=True):
            km = kaplan_meier(g["time"], g["event"])
            t = np.r_[km.times, horizon]
            s = np.r_[km.surv, km.surv[-1]]
            control = dose == 0  # dashed and on top: a dose whose curve equals the control's stays visible beneath
            ax.step(t, s, where="post", color=colours[dose], lw=1.4 if control else 2.0, ls="--" if control else "-",
                    zorder=3 if control else 2, label=f"{_dose_label(dose)} ({km.events}/{km.runs})")
        ax.set_title(f"lr {lr:g}", fontsize=10)
        ax.set_xlim(0, horizon)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share not collapsed (Kaplan-Meier)")
    for ax in axes:  # a legend per panel: events/runs differ per lr
        ax.legend(fontsize=7, title="dose (k/n)", title_fontsize=7, loc="lower left")
    fig.suptitle(f"time to collapse, censored at step {horizon:g}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def km_arms_figure(runs: pd.DataFrame, horizon: float, path: Path, dpi: int = 100) -> Path:
    """Kaplan-Meier curves of the time to collapse, one per arm (``python -m analysis survival``)."""
    fig = Figure(figsize=(5.6, 3.6))
    ax = fig.subplots()
    for i, (label, g) in enumerate(runs.groupby("label", sort=True)):
        km = kaplan_meier(g["time"], g["event"])
        ax.step(np.r_[km.times, horizon], np.r_[km.surv, km.surv[-1]], where="post", lw=2.0, color=f"C{i}",
                label=f"{label} ({km.events}/{km.runs})")
    ax.set_xlim(0, horizon)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("share not collapsed (Kaplan-Meier)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="arm (collapsed/runs)", title_fontsize=8, loc="lower left")
    ax.set_title(f"time to collapse, censored at step {horizon:g}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path
