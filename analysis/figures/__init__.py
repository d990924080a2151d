"""Figures (matplotlib, Agg), each written as ``<name>.png`` and ``<name>.pdf``.

Every figure has a fixed size (:data:`FIG_SIZES`, inches; PNG pixels = inches x ``dpi``) or one set by its
content - a grid of small multiples, a forest plot's rows (:func:`figure_size`) -, the style of the KwaiKAT
reference figures (title, "Step" axis, dashed light grid) with every legend outside the data, and the report's
:class:`analysis.palette.Palette`, so a group has one colour everywhere.

- ``reward_vs_step``: per group, the IQM across seeds of the runs' smoothed reward, with a band - the
  bootstrap CI of the IQM - only for groups with >= ``min_seeds`` seeds (with 2-4 seeds a percentile "CI"
  is about the seeds' min-max range); the title or legend says which groups have one.
- ``kl_vs_step``: the same for the raw ``mismatch/k3``, on a symmetric-log y axis when the positive values
  span a decade or more (linear below the decade under the smallest positive value, so a k3 of exactly 0 -
  the ``rollout`` estimator's denominator is the sampling log-prob itself - stays visible), on a linear axis
  otherwise (a log axis would label no tick).
- More than :data:`SMALL_MULTIPLES_ABOVE` groups: reward, KL and survival become **small multiples**, one
  panel per camp (:func:`camp_panels`: the estimator's declared ``camp``; a camp of more than
  :data:`MAX_PER_PANEL` groups split), a shared y axis, each panel with the reference arms (recompute black,
  rollout gray dashed, thin, no band) and its legend below it. Step axes have integer ticks.
- ``survival``: Kaplan-Meier share of runs not yet collapsed by step s, censoring marked ``+``, the legend
  giving each group's collapsed/runs; the curves of one axes are offset vertically by
  :data:`SURVIVAL_OFFSET` each (the title says by how much at most), so that groups that never collapse do not
  hide one another at 1.0.
- ``collapse_onset``: one point per run: the rule's onset (filled; ``X`` for a non-finite loss), the
  change-point estimate (black ``|``), censored runs as open ``>`` at their last step.
- ``n_sweep`` / ``tis_sensitivity``: collapse rate (Wilson CI) and IQM final reward (bootstrap CI at points
  with >= ``min_seeds`` runs) against n (``mean_n``) / against C (``tis`` and ``mis``, token vs sequence as
  line styles; the title names the levels present). Tick labels at 3 significant figures, thinned so they
  never overprint; no CI band or CI claim when every point has one run.
- ``forest``: the pair comparisons of the verdicts (:mod:`analysis.verdicts`, ``FigureContext.comparisons``):
  one row per pair tested in a family - the primary ones, then the exploratory ones that separate, then
  :data:`FOREST_REST` more by smallest p -, one panel per endpoint, the effect A - B with its simultaneous
  interval, filled when it separates, hollow (gray) when not; seeds and Holm p in a right-hand column.
  Missing when no pair has enough seeds to be tested.

A figure whose inputs are missing raises :class:`MissingInput` with the reason; the report turns it
into a note.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .base import (FIG_SIZES, FOREST_REST, FORMATS, SMALL_MULTIPLES_ABOVE, FigureContext, MissingInput, _save,
                   camp_panels, figure_size, pixel_size)
from .curves import collapse_onset, kl_vs_step, reward_vs_step, survival
from .forest import forest, forest_rows
from .sweep import SWEEP_CAPTION, draw_sweep, n_sweep, sweep_figure, tis_sensitivity

__all__ = ["FIG_SIZES", "FIGURES", "FOREST_REST", "FORMATS", "FigureContext", "MissingInput", "SWEEP_CAPTION",
           "camp_panels", "draw", "draw_sweep", "figure", "figure_size", "forest_rows", "pixel_size", "sweep_figure"]

MULTIPLES = (f"With more than {SMALL_MULTIPLES_ABOVE} groups: one panel per camp of estimators, recompute (black) and "
             "rollout (gray, dashed) in every panel as references.")
FIGURES = {
    "reward_vs_step": (reward_vs_step,
                       "Reward vs step: IQM across seeds of the smoothed reward. The band is the bootstrap CI of the "
                       "IQM, drawn only for groups with >= min_seeds seeds (default 5: with 2-4 seeds a percentile "
                       "interval is about the seeds' min-max range, not a 95% CI); the title or legend says which "
                       "groups have one. " + MULTIPLES),
    "kl_vs_step": (kl_vs_step,
                   "Train-inference mismatch `mismatch/k3` vs step (IQM across seeds; symlog y when the values span "
                   "a decade; band as in the reward figure). " + MULTIPLES),
    "survival": (survival,
                 "Share of runs not yet collapsed by step s (Kaplan-Meier; + marks censored runs; the legend gives "
                 "each group's collapsed/runs). Curves are offset vertically by a few thousandths each (the title "
                 "says how much at most) so that groups at 1.0 do not hide one another. " + MULTIPLES),
    "collapse_onset": (collapse_onset, "Collapse onset per run: drop-from-peak rule (filled), non-finite loss (X), "
                                       "change-point estimate (|), censored runs (open >) at their last step."),
    "forest": (forest,
               "Pair comparisons (forest plot): the effect A - B (collapse-rate difference; final-reward difference, "
               "the mean per-seed difference where seeds pair) with its bootstrap interval at the family's "
               "simultaneous level 1 - alpha/m; filled = separates (Holm p < alpha within its family), hollow gray = "
               "not shown. Primary pairs first, then the exploratory pairs that separate and the next ones by "
               "smallest p (the title says how many of how many); right: seeds and Holm p per endpoint. The verdict "
               "is the test's: with few seeds a percentile interval can exclude 0 for a pair that does not separate "
               "(when every seed's difference has one sign no resample reaches 0, whatever the level). Trend tests "
               "and every comparison: verdicts.md."),
    "n_sweep": (n_sweep, "n-sweep: collapse rate and final reward of mean_n against the number of inference passes n."),
    "tis_sensitivity": (tis_sensitivity, "Sensitivity to the cap C: collapse rate and final reward of TIS (and MIS) "
                                         "against C, token level solid, sequence level dashed."),
}


def figure(name: str, ctx: FigureContext) -> Figure:
    """Build figure ``name`` (a key of :data:`FIGURES`) without saving it; raises :class:`MissingInput`."""
    fn, _ = FIGURES[name]
    return fn(ctx)


def draw(name: str, ctx: FigureContext) -> list[Path]:
    """Draw figure ``name`` and write its PNG and PDF; raises :class:`MissingInput`. Text is drawn as written:
    no mathtext (a label ``$\\macro$`` from a tag stopped every figure on d747b32; :mod:`analysis.escape`)."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        return _save(figure(name, ctx), ctx, name)
