"""``python -m analysis dose``: the dose-response of collapse to each inference perturbation, with the
train-inference KL measured along training, not only at the warm start (issue 15, item 4).

**Arms.** A run's arm is its ``perturbation`` tag (``harness.tags.perturbation``: ``none``, or
``kind=level`` for the one explicit perturbation that is on), parsed by :func:`parse_perturbation` into
(kind, level), kind in ``none`` (the control), ``router`` (router-logit noise sigma), ``logit``
(output-logit noise sigma) or ``bias`` (probabilities below 0.05 scaled by delta). A KL-held run
(``inference.kl_target``: its perturbation rescaled every step to hold the train-inference k3 at a target,
``harness/backends/local/kl_control.py``) is tagged ``kind@k3=target``: its arm is (kind, target), held, its dose
the target, and the table adds the perturbation level it ran at (``perturb/level``: the IQM over runs of each
run's mean over its steps) and how many of its runs held the target: mean k3 over the last E steps within
``HELD_WITHIN`` = 1.5x of it (a run that did not, its perturbation at its bound or its window moved by a few
large per-step k3, is counted, not hidden). A tag naming several
perturbations at once (``router=1,bias=0.5``), an unknown kind, a level that is no number, or a run
without the tag is refused (:class:`analysis.load.AnalysisError`, exit 2): such a run has no place on
one dose axis. Arms sort by kind (none, router, logit, bias), then by dose: sigma ascending for the two
noises, delta *descending* for the bias (``dose = 1 - delta``: a smaller delta is a larger bias). The
experiment must hold one estimator configuration and one spec per arm (a dose sweep varies only the
perturbation); otherwise the command refuses and names ``--filter``.

**Runs** are loaded as by ``python -m analysis report`` (:func:`analysis.load.load_experiment`: FINISHED
and non-superseded runs only, left-out runs listed in a note) and measured by
:func:`analysis.measures.measure_experiment` (collapse = the drop rule v2 with its persistence rule, or a
non-finite loss; the final reward).

**Per run**, over its logged steps s (finite values only; E = ``edge`` = 50 steps):

- ``k3 = mean_s mismatch/k3[s]``, the token-mean ``exp(d) - d - 1``, ``d = logp_old - logp_inf``: with
  ``recompute`` (``logp_old = logp_rec``) the k3 estimate of the train-inference KL(p_inf || p_train)
  along the whole run (the metric is ``cfg.kl_metric``);
- ``k3 first`` / ``k3 last``: the same mean over the first / last E logged steps (how the KL moves);
- ``bias_sq = mean_s mismatch/bias_sq[s]`` and ``var = mean_s noise/var_rollout[s]``, the two terms of
  ``E_i[(logp_rec - logp_inf[i])^2] = bias_sq + var_rollout`` (``harness/metrics.py``);
- bias share ``bias_sq / (bias_sq + var)`` of the run's means. (For a small mismatch ``KL ~ E[d^2] / 2``:
  expect ``bias_sq + var`` near ``2 k3``; the two terms come from the diagnostic sequences only.)

A metric the run never logged is NaN for that run, never 0.

**Per arm**: runs, collapsed k/n with the Wilson interval, Kaplan-Meier median onset (``-`` when no run
collapsed), IQM of the starting reward R0 (the smoothed reward at the first step: an arm that sharpens the
sampler starts higher, a confound of the bias arms), of the final reward and of each per-run quantity
above, with its bootstrap CI (:func:`analysis.stats.iqm_ci`, over the runs that logged the metric; ``-``
and a note when none did).

**Equal KL** (:func:`equal_kl_table`): for every pair of kinds (A, B) in kind order, every arm a of A
and b of B whose along-training KL intervals overlap, ``lo_a <= hi_b`` and ``lo_b <= hi_a`` (the 95 %
bootstrap CIs of the IQM of the per-run ``k3``), or whose IQMs differ by at most ``KL_TOLERANCE`` = 1.1x
(KL-held arms' intervals are ~1 % wide and miss each other at a ratio of 1.0), is a matched pair; arms without
an interval (fewer than 2 runs with the metric) are never matched. For each matched pair: the KL ratio ``k3_a / k3_b`` of the
IQMs and the difference in collapse rate ``p_a - p_b`` with Newcombe's hybrid score interval
(:func:`analysis.stats.newcombe_diff`). A pair of kinds with no matched arms gets one row saying so, naming
the nearest pair (k3 IQMs closest in log) and its KL ratio, which is not a match.

Outputs in ``--out``: ``dose.{md,csv,tex}``, ``dose_equal_kl.{md,csv,tex}`` (:class:`analysis.tables.Table`,
so ``python -m analysis readme`` can fill a ``<!-- generated: results/dose/dose.md -->`` block) and
``dose.png``/``.pdf`` (:mod:`analysis.dose_figure`). Nothing is logged to MLflow: the store is only read.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from harness import metrics as M

from .config import AnalysisConfig
from .histories import open_experiment
from .load import AnalysisError, Experiment, require_one_estimator
from .paths import out_folder
from .measures import measure_experiment
from .stats import Interval, iqm_ci, km_median, newcombe_diff, wilson
from .tables import Table, _interval_cols, fmt_step

KINDS = ("none", "router", "logit", "bias")  # table and pair order
EDGE = 50  # steps at each end of a run for "k3 first" / "k3 last"
# the params a dose experiment's arms may differ in: the perturbations' levels (harness.spec.PERTURBATIONS; analysis
# does not import the config: tests/analysis/test_dose.py checks the two lists agree) and the KL target
PERTURBATION_PARAMS = frozenset({"inference.router_noise_sigma", "inference.logit_noise_sigma", "inference.bias_delta",
                                 "inference.kl_target"})
KL_TOLERANCE = 1.1  # two arms whose k3 IQMs differ by at most this factor are at equal KL (besides overlapping CIs)
HELD_WITHIN = 1.5  # a held run holds its target when its mean k3 over the last EDGE steps is within this factor
TERMS = {"bias_sq": M.MISMATCH_BIAS_SQ, "var_rollout": M.NOISE_VAR_ROLLOUT}


@dataclass(frozen=True)
class Arm:
    kind: str
    level: float  # NaN for the control; the KL target of a held arm
    held: bool = False  # KL-held: the perturbation rescaled along training to hold k3 at ``level``

    @property
    def dose(self) -> float:
        """The order within a kind: sigma for the noises, 1 - delta for the bias, 0 for the control."""
        if self.kind == "none":
            return 0.0
        return 1.0 - self.level if self.kind == "bias" and not self.held else self.level

    @property
    def name(self) -> str:
        if self.kind == "none":
            return "none"
        return f"{self.kind}@k3={self.level:g}" if self.held else f"{self.kind}={self.level:g}"

    @property
    def order(self) -> tuple[int, bool, float]:
        return KINDS.index(self.kind), self.held, self.dose


def parse_perturbation(text: object, where: str = "run") -> Arm:
    """A ``perturbation`` tag -> :class:`Arm` (module docstring); :class:`AnalysisError` when it is not one arm."""
    raw = "" if text is None else str(text).strip()
    if not raw:
        raise AnalysisError(f"{where}: no `perturbation` tag; a dose arm needs one (`none` or `kind=level`)")
    if raw.lower() == "none":
        return Arm("none", math.nan)
    parts = [p for p in raw.split(",") if p.strip()]
    if len(parts) > 1:
        raise AnalysisError(f"{where}: perturbation {raw!r} sets {len(parts)} perturbations at once; a dose arm has "
                            "exactly one (`router=S`, `logit=S` or `bias=D`) or none")
    m = re.fullmatch(r"\s*([a-z_]+)\s*(@k3)?\s*=\s*(\S+)\s*", parts[0])
    if not m or m.group(1) not in KINDS[1:]:
        raise AnalysisError(f"{where}: perturbation {raw!r} is not one of none, router=S, logit=S, bias=D "
                            "(or kind@k3=K, KL-held)")
    try:
        level = float(m.group(3))
    except ValueError:
        raise AnalysisError(f"{where}: perturbation {raw!r}: level {m.group(3)!r} is not a number") from None
    if not math.isfinite(level):
        raise AnalysisError(f"{where}: perturbation {raw!r}: level must be finite")
    return Arm(m.group(1), level, held=m.group(2) is not None)


def _mean(s: pd.Series) -> float:
    v = s.to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else math.nan


def run_frame(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig, edge: int = EDGE) -> pd.DataFrame:
    """One row per run: its arm, collapse measures and the along-training mismatch (module docstring)."""
    m = measures.set_index("run_id")
    rows = []
    for run in exp.runs.itertuples():
        arm = parse_perturbation(run.perturbation, f"run {run.run_id[:8]} ({run.label} seed {run.seed})")
        k3 = exp.series(cfg.kl_metric, run.run_id).sort_index()
        level = exp.series(M.PERTURB_LEVEL, run.run_id).sort_index()
        row = {"run_id": run.run_id, "label": run.label, "seed": run.seed, "arm": arm.name, "kind": arm.kind,
               "level": arm.level, "held": arm.held, "held_level": _mean(level),
               "held_level_first": _mean(level.iloc[:edge]), "held_level_last": _mean(level.iloc[-edge:]),
               "collapsed": bool(m.at[run.run_id, "collapsed"]),
               "collapse_time": float(m.at[run.run_id, "collapse_time"]), "final": float(m.at[run.run_id, "final"]),
               "r0": float(m.at[run.run_id, "r0"]),
               "k3": _mean(k3), "k3_first": _mean(k3.iloc[:edge]), "k3_last": _mean(k3.iloc[-edge:])}
        for col, metric in TERMS.items():
            row[col] = _mean(exp.series(metric, run.run_id))
        # held: judged on what the controller holds, mismatch/rec_k3 (= mismatch/k3 for recompute-style estimators)
        held_k3 = _mean(exp.series(M.MISMATCH_REC_K3, run.run_id).sort_index().iloc[-edge:]) if arm.held else math.nan
        row["held_ok"] = (bool(arm.level / HELD_WITHIN <= held_k3 <= arm.level * HELD_WITHIN)
                          if arm.held and math.isfinite(held_k3) else math.nan)
        total = row["bias_sq"] + row["var_rollout"]
        row["bias_share"] = row["bias_sq"] / total if total > 0 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _check_one_spec_per_arm(exp: Experiment, runs: pd.DataFrame) -> None:
    """Refuse experiments that would pool different estimators or specs into one arm."""
    require_one_estimator(exp.name, exp.runs["label"], "a dose table")
    keys = runs.merge(exp.runs[["run_id", "group_key"]], on="run_id").groupby("arm")["group_key"].nunique()
    mixed = keys[keys > 1]
    if len(mixed):
        raise AnalysisError(f"arm(s) {', '.join(mixed.index)} hold runs of several specs (group_sig); they differ in "
                            "more than the seed and the perturbation: narrow the runs with --filter")
    params = [p for p in exp.group_params.values() if p]  # what the arms' runs logged (synthetic runs: nothing)
    differ = sorted(k for k in set().union(*params) if k not in PERTURBATION_PARAMS
                    and len({p.get(k) for p in params}) > 1)
    if differ:
        raise AnalysisError(f"experiment {exp.name!r}: its arms differ in more than the perturbation "
                            f"({', '.join(differ)}), so a dose-response over them would compare specs, not doses: "
                            "narrow the runs to one value of each with --filter, e.g. --filter \"params.`"
                            f"{differ[0]}` = '...'\"")


def _sci(iv: Interval) -> str:
    if not np.isfinite(iv.point):
        return "-"
    if not (np.isfinite(iv.lo) and np.isfinite(iv.hi)):
        return f"{iv.point:.2g}"
    return f"{iv.point:.2g} [{iv.lo:.2g}, {iv.hi:.2g}]"


MISMATCH_COLS = ("k3", "k3_first", "k3_last", "bias_sq", "var_rollout", "bias_share")


def arm_frame(runs: pd.DataFrame, cfg: AnalysisConfig) -> pd.DataFrame:
    """One row per arm in dose order: the numbers behind ``dose.csv`` (intervals as point, _lo, _hi)."""
    by_name = {r.arm: Arm(r.kind, r.level, bool(r.held)) for r in runs.itertuples()}  # the control's level is NaN
    arms = sorted(by_name.values(), key=lambda a: a.order)
    rows = []
    for arm in arms:
        kind, level, name = arm.kind, arm.level, arm.name
        g = runs[runs["arm"] == name]
        n, c = len(g), int(g["collapsed"].sum())
        seed = cfg.seed  # intervals are keyed by their data (stats.data_rng)
        row = {"arm": name, "kind": kind, "level": level, "held": arm.held, "runs": n, "collapsed": c,
               **_interval_cols("collapse_rate", wilson(c, n, cfg.ci)),
               "onset_km_median": km_median(g["collapse_time"].to_numpy(float), g["collapsed"].to_numpy(bool)),
               **_interval_cols("final_iqm", iqm_ci(g["final"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)),
               **_interval_cols("r0_iqm", iqm_ci(g["r0"].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed))}
        if arm.held:
            row["held_ok"] = int(g["held_ok"].sum())
            for col in ("held_level", "held_level_first", "held_level_last"):
                row.update(_interval_cols(f"{col}_iqm", iqm_ci(g[col].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)))
        for col in MISMATCH_COLS:
            row[f"{col}_runs"] = int(np.isfinite(g[col].to_numpy(float)).sum())
            row.update(_interval_cols(f"{col}_iqm", iqm_ci(g[col].to_numpy(float), cfg.bootstrap_reps, cfg.ci, seed)))
        rows.append(row)
    return pd.DataFrame(rows)


def _iv(row, prefix: str) -> Interval:
    return Interval(row[prefix], row[f"{prefix}_lo"], row[f"{prefix}_hi"])


def dose_table(arms: pd.DataFrame, cfg: AnalysisConfig, edge: int = EDGE) -> Table:
    """``dose``: one row per arm (module docstring)."""
    rows, held = [], bool(arms["held"].any())
    for r in arms.to_dict("records"):
        rows.append({
            "arm": r["arm"], "runs": r["runs"], "collapsed": f"{r['collapsed']}/{r['runs']}",
            **({"level held (IQM)": _sci(_iv(r, "held_level_iqm")) if r["held"] else "-",
                f"level first {edge}": _sci(_iv(r, "held_level_first_iqm")) if r["held"] else "-",
                f"level last {edge}": _sci(_iv(r, "held_level_last_iqm")) if r["held"] else "-",
                f"held (last {edge})": f"{int(r['held_ok'])}/{r['runs']}" if r["held"] else "-"} if held else {}),
            "collapse rate": _iv(r, "collapse_rate").fmt(2),
            "onset (KM median)": fmt_step(r["onset_km_median"]) if r["collapsed"] else "-",
            "R0 (IQM)": _iv(r, "r0_iqm").fmt(),
            "final (IQM)": _iv(r, "final_iqm").fmt(),
            "k3 along training (IQM)": _sci(_iv(r, "k3_iqm")),
            f"k3 first {edge}": _sci(_iv(r, "k3_first_iqm")),
            f"k3 last {edge}": _sci(_iv(r, "k3_last_iqm")),
            "bias_sq (IQM)": _sci(_iv(r, "bias_sq_iqm")),
            "var_rollout (IQM)": _sci(_iv(r, "var_rollout_iqm")),
            "bias share": _iv(r, "bias_share_iqm").fmt(2) if np.isfinite(r["bias_share_iqm"]) else "-",
        })
    t = Table("dose", "Dose-response: collapse against the train-inference KL along training", pd.DataFrame(rows),
              arms, cfg.describe(), short_footer=cfg.describe_short())
    t.notes.append(f"per run: the mean over its logged steps of {cfg.kl_metric} (k3; first / last {edge} logged steps), "
                   f"{M.MISMATCH_BIAS_SQ} and {M.NOISE_VAR_ROLLOUT}, and bias share = bias_sq / (bias_sq + var_rollout) "
                   f"of those means; per arm: IQM over runs [{cfg.ci:.0%} bootstrap CI]; collapse rate: Wilson "
                   f"{cfg.ci:.0%} interval; bias arms sort by delta descending (smaller delta = larger dose).")
    if held:
        t.notes.append(f"kind@k3=K: KL-held arm, its perturbation rescaled every step to hold {M.MISMATCH_REC_K3} at K "
                       f"(inference.kl_target); level held: IQM over runs of each run's mean {M.PERTURB_LEVEL} (sigma, or "
                       f"the bias delta) [bootstrap CI], and over its first / last {edge} steps; held: runs whose mean "
                       f"{M.MISMATCH_REC_K3} over the last {edge} steps is within "
                       f"{HELD_WITHIN:g}x of K (the others did not hold it there: a perturbation at its bound, or a few large "
                       "per-step k3 in that window).")
    t.notes += missing_notes(arms)
    return t


def missing_notes(arms: pd.DataFrame) -> list[str]:
    """A note per mismatch quantity that some arm's runs did not log ('-' in the table, never 0)."""
    notes = []
    for col in MISMATCH_COLS:
        short = arms[arms[f"{col}_runs"] < arms["runs"]]
        if not len(short):
            continue
        none = short[short[f"{col}_runs"] == 0]["arm"].tolist()
        some = [f"{r.arm} ({getattr(r, f'{col}_runs')}/{r.runs} runs)" for r in short.itertuples()
                if getattr(r, f"{col}_runs") > 0]
        parts = ([f"no value in any run of {', '.join(none)} ('-' in the table)"] if none else []) + \
                ([f"a value in only part of the runs of {', '.join(some)}; the IQM is over those"] if some else [])
        notes.append(f"{col}: {'; '.join(parts)}.")
    return notes


def matched_pairs(arms: pd.DataFrame) -> list[tuple[tuple[str, str], list[tuple[dict, dict]]]]:
    """For every pair of kinds present, the arm pairs whose along-training k3 CIs overlap (module docstring)."""
    recs = arms.to_dict("records")
    kinds = [k for k in KINDS if k in set(arms["kind"])]
    has_ci = lambda r: np.isfinite(r["k3_iqm_lo"]) and np.isfinite(r["k3_iqm_hi"])  # noqa: E731
    out = []
    for ka, kb in itertools.combinations(kinds, 2):
        pairs = [(a, b) for a in recs if a["kind"] == ka for b in recs if b["kind"] == kb
                 if has_ci(a) and has_ci(b) and (a["k3_iqm_lo"] <= b["k3_iqm_hi"] and b["k3_iqm_lo"] <= a["k3_iqm_hi"]
                                                 or _within(a["k3_iqm"], b["k3_iqm"], KL_TOLERANCE))]
        out.append(((ka, kb), pairs))
    return out


def _within(a: float, b: float, factor: float) -> bool:
    return a > 0 and b > 0 and max(a / b, b / a) <= factor


def nearest_text(arms: pd.DataFrame, ka: str, kb: str) -> str:
    """`` (nearest: a / b, k3 ratio r)``: the pair of arms of kinds ka, kb whose k3 IQMs are closest in log
    (not a match: their CIs do not overlap); "" when an arm has no k3 > 0."""
    a, b = (arms[(arms["kind"] == k) & (arms["k3_iqm"] > 0)] for k in (ka, kb))
    if not (len(a) and len(b)):
        return ""
    gap = np.abs(np.log(a["k3_iqm"].to_numpy(float))[:, None] - np.log(b["k3_iqm"].to_numpy(float))[None, :])
    i, j = np.unravel_index(np.argmin(gap), gap.shape)
    ra, rb = a.iloc[i], b.iloc[j]
    return f" (nearest: {ra['arm']} / {rb['arm']}, k3 ratio {ra['k3_iqm'] / rb['k3_iqm']:.2g})"


EQUAL_KL_COLUMNS = ("kinds", "arm A", "arm B", "k3 A", "k3 B", "k3 A / B", "collapsed A", "collapsed B",
                    "rate A - B [Newcombe CI]")


def equal_kl_table(arms: pd.DataFrame, cfg: AnalysisConfig) -> Table:
    """``dose_equal_kl``: matched arm pairs and their difference in collapse rate (module docstring)."""
    rows, data = [], []

    def empty(kinds: str, why: str) -> dict:
        return {**dict.fromkeys(EQUAL_KL_COLUMNS, "-"), "kinds": kinds, EQUAL_KL_COLUMNS[-1]: why}

    found = matched_pairs(arms)
    if not found:
        rows.append(empty("-", "fewer than two kinds of arm: nothing to match"))
    for (ka, kb), pairs in found:
        if not pairs:
            rows.append(empty(f"{ka} vs {kb}", "no arms at equal KL" + nearest_text(arms, ka, kb)))
            data.append({"kind_a": ka, "kind_b": kb, "arm_a": "", "arm_b": ""})
            continue
        for a, b in pairs:
            d = newcombe_diff(a["collapsed"], a["runs"], b["collapsed"], b["runs"], cfg.ci)
            ratio = a["k3_iqm"] / b["k3_iqm"] if b["k3_iqm"] > 0 else math.nan
            rows.append({"kinds": f"{ka} vs {kb}", "arm A": a["arm"], "arm B": b["arm"],
                         "k3 A": _sci(_iv(a, "k3_iqm")), "k3 B": _sci(_iv(b, "k3_iqm")),
                         "k3 A / B": "-" if not np.isfinite(ratio) else f"{ratio:.2f}",
                         "collapsed A": f"{a['collapsed']}/{a['runs']}", "collapsed B": f"{b['collapsed']}/{b['runs']}",
                         "rate A - B [Newcombe CI]": d.fmt(2)})
            data.append({"kind_a": ka, "kind_b": kb, "arm_a": a["arm"], "arm_b": b["arm"],
                         **{f"k3_{s}{x}": r[f"k3_iqm{x}"] for s, r in (("a", a), ("b", b)) for x in ("", "_lo", "_hi")},
                         "k3_ratio": ratio, "collapsed_a": a["collapsed"], "runs_a": a["runs"],
                         "collapsed_b": b["collapsed"], "runs_b": b["runs"], **_interval_cols("rate_diff", d)})
    t = Table("dose_equal_kl", "Equal KL along training: collapse rate of arms whose KL intervals overlap",
              pd.DataFrame(rows, columns=list(EQUAL_KL_COLUMNS)), pd.DataFrame(data), cfg.describe(),
              short_footer=cfg.describe_short())
    t.notes.append(f"arms a, b of two kinds are matched when the {cfg.ci:.0%} bootstrap CIs of their IQM along-training "
                   f"k3 overlap (lo_a <= hi_b and lo_b <= hi_a) or their IQMs differ by at most {KL_TOLERANCE:g}x (held "
                   "arms' CIs are too narrow to overlap); arms without a CI are never matched; rate A - B: "
                   f"difference of collapse rates with Newcombe's hybrid score {cfg.ci:.0%} interval.")
    return t


@dataclass
class DoseResult:
    out_dir: Path
    tables: dict[str, Table] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)


def median_k3_per_step(exp: Experiment, runs: pd.DataFrame, cfg: AnalysisConfig) -> dict[str, pd.Series]:
    """Per arm, the median over its runs of the k3 logged at each step (NaN-skipping)."""
    out = {}
    for name, g in runs.groupby("arm", sort=False):
        wide = exp.wide(cfg.kl_metric, g["run_id"])
        if not wide.empty:
            out[name] = wide.median(axis=1, skipna=True).dropna()
    return out


def build_dose(experiment: str, tracking_uri: str | None = None, out_dir: str | Path | None = None,
               cfg: AnalysisConfig | None = None, filter_string: str | None = None,
               include_unfinished: bool = False, echo: Callable[[str], None] | None = print,
               edge: int = EDGE, source: str | Path | None = None) -> DoseResult:
    """Write the dose tables and figure of ``experiment`` (module docstring). Raises ``AnalysisError``.
    ``source``: an exported histories file read instead of the store (:mod:`analysis.histories`)."""
    cfg = cfg or AnalysisConfig()
    if edge < 1:
        raise AnalysisError(f"--edge must be >= 1, got {edge}")
    metrics = (cfg.reward_metric, cfg.loss_metric, cfg.kl_metric, *TERMS.values(), M.PERTURB_LEVEL, M.MISMATCH_REC_K3)
    exp = open_experiment(experiment, tracking_uri, source, metrics=metrics, filter_string=filter_string,
                          include_unfinished=include_unfinished)
    experiment = exp.name
    if exp.runs.empty:
        raise AnalysisError(f"experiment {experiment!r} holds no training runs to put on a dose axis")
    measures = measure_experiment(exp, cfg)
    runs = run_frame(exp, measures, cfg, edge)
    _check_one_spec_per_arm(exp, runs)
    out = out_folder(experiment, out_dir)  # under the project, name sanitised
    out.mkdir(parents=True, exist_ok=True)
    result = DoseResult(out, notes=list(exp.notes), runs=runs)
    arms = arm_frame(runs, cfg)
    for t in (dose_table(arms, cfg, edge), equal_kl_table(arms, cfg)):
        t.notes = [*exp.notes, *t.notes]
        t.write(out)
        result.tables[t.name] = t

    from .dose_figure import draw_dose

    result.figures, fig_notes = draw_dose(arms, median_k3_per_step(exp, runs, cfg), cfg, out)
    result.notes += fig_notes
    if echo:
        echo("\n".join([f"# {experiment}: {len(runs)} runs in {len(arms)} arms",
                        *(t.terminal() for t in result.tables.values()),
                        *(f"note: {n}" for n in fig_notes),
                        f"\nfiles: {', '.join(sorted(p.name for p in out.glob('dose*')))} in {out}"]))
    return result
