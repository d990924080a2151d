"""``python -m analysis validate``: the collapse detector against labelled curves.

Sets:

- ``synthetic``: :func:`analysis.benchmark.synthetic_set` (1200 curves from one seed, known onsets);
- every ``analysis/labelled/<set>_labels.csv`` with its ``<set>_curves.csv``: curves labelled by hand
  (digitized published figures, the project's own runs). ``<set>_curves.csv``: ``curve,step,reward``
  (long format); ``<set>_labels.csv``: ``curve,label,onset,source,reason`` with label ``collapse``,
  ``transient`` or ``stable`` (the onset, in steps, only for collapses and transients).

Per set: flagged = the rule's persistent collapse (:func:`analysis.measures.detect`); precision =
flagged and labelled collapse / flagged among labelled curves; recall = flagged / labelled collapse;
onset error = |rule onset - labelled onset| over the collapses found (median), and the same for the
change-point estimate beside the rule (:func:`analysis.measures.changepoint_onset_index`). Curves of
the synthetic grey kind carry no label: their flag rate is printed, they count in neither number.
Agreement = curves whose verdict is their label (collapse = persistent, transient, stable), of the labelled ones.

For the hand-labelled sets, ``validate`` also lists where the rule and the eye differ: a verdict other than the label,
or a collapse found with |onset error| > ``ONSET_TOL`` steps (2 W: more than the smoothing window can explain), with
the run's noise sd and the rule's margin, so each difference can be read against the curve.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .benchmark import N_DEFAULT, SEED_DEFAULT, LabelledCurve, synthetic_set
from .config import AnalysisConfig
from .load import AnalysisError
from .measures import changepoint_onset_index, detect, rule_margin, smooth

DATA_DIR = Path(__file__).resolve().parent / "labelled"
LABELS = ("collapse", "transient", "stable")
VERDICT = {"collapse": "persistent", "transient": "transient", "stable": "stable"}  # label -> the rule's word
ONSET_TOL = 20  # steps: a collapse found further than this from its labelled onset is listed as a difference


@dataclass
class SetResult:
    name: str
    curves: int
    positives: int  # labelled collapse
    flagged: int  # flagged among labelled curves
    tp: int
    agree: int  # labelled curves whose verdict is their label
    precision: float
    recall: float
    onset_err_median: float
    cp_err_median: float
    by_kind: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # kind -> (curves, flagged, transient)
    rows: list[dict] = field(default_factory=list)  # one per curve


def changepoint(values: np.ndarray, cfg: AnalysisConfig, sigma: float) -> int | None:
    """The change-point estimate of one curve, as the report computes it (min drop = the rule's margin)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return None
    S = smooth(x, cfg.smooth_window, cfg.smooth_kind)
    pk = int(np.nanargmax(S))
    return changepoint_onset_index(x, pk, cfg.cp_pen_scale, cfg.cp_min_size,
                                   float(rule_margin(sigma, S[pk] - S[0], cfg)))


def evaluate(name: str, curves: list[LabelledCurve], cfg: AnalysisConfig, with_cp: bool = True) -> SetResult:
    rows = []
    for c in curves:
        d = detect(c.values, cfg)
        cp = changepoint(c.values, cfg, d.sigma) if with_cp and c.label == "collapse" else None
        rows.append({"curve": c.name, "kind": c.kind, "label": c.label, "onset": c.onset, "flagged": d.collapsed,
                     "verdict": d.kind, "rule_onset": d.onset if d.onset is not None else math.nan,
                     "cp_onset": cp if cp is not None else math.nan, "sigma_S": d.sigma, "margin": d.margin})
    f = pd.DataFrame(rows)
    lab = f[f["label"] != ""]
    pos = lab["label"] == "collapse"
    tp = int((pos & lab["flagged"]).sum())
    flagged = int(lab["flagged"].sum())
    found = lab[pos & lab["flagged"]]
    err = (found["rule_onset"] - found["onset"]).abs().dropna()
    cp_found = lab[pos].dropna(subset=["cp_onset"])
    cp_err = (cp_found["cp_onset"] - cp_found["onset"]).abs().dropna()
    by_kind = {k: (len(g), int(g["flagged"].sum()), int((g["verdict"] == "transient").sum()))
               for k, g in f.groupby("kind", sort=False)}
    return SetResult(
        name=name, curves=len(f), positives=int(pos.sum()), flagged=flagged, tp=tp,
        agree=int((lab["verdict"] == lab["label"].map(VERDICT)).sum()),
        precision=tp / flagged if flagged else math.nan, recall=tp / int(pos.sum()) if pos.any() else math.nan,
        onset_err_median=float(err.median()) if len(err) else math.nan,
        cp_err_median=float(cp_err.median()) if len(cp_err) else math.nan, by_kind=by_kind, rows=rows)


def load_labelled(labels_csv: Path) -> list[LabelledCurve]:
    """One hand-labelled set (module docstring); a malformed file is an :class:`AnalysisError`."""
    curves_csv = labels_csv.with_name(labels_csv.name.replace("_labels.csv", "_curves.csv"))
    try:
        labels = pd.read_csv(labels_csv, comment="#")
        values = pd.read_csv(curves_csv, comment="#")
    except (OSError, pd.errors.ParserError) as exc:
        raise AnalysisError(f"cannot read labelled set {labels_csv.name}: {exc}") from None
    for frame, need, path in ((labels, {"curve", "label", "onset"}, labels_csv), (values, {"curve", "step", "reward"}, curves_csv)):
        if not need <= set(frame.columns):
            raise AnalysisError(f"{path}: needs columns {sorted(need)}, has {list(frame.columns)}")
    bad = sorted(set(labels["label"]) - set(LABELS))
    if bad:
        raise AnalysisError(f"{labels_csv}: unknown label(s) {bad}; allowed: {', '.join(LABELS)}")
    dup = sorted(set(labels.loc[labels["curve"].duplicated(), "curve"]))
    if dup:
        raise AnalysisError(f"{labels_csv}: curve(s) labelled twice: {dup}")
    for row in labels.itertuples():
        if row.label == "collapse" and pd.isna(row.onset):
            raise AnalysisError(f"{labels_csv}: curve {row.curve!r} is labelled collapse without an onset")
        if row.label == "stable" and pd.notna(row.onset):
            raise AnalysisError(f"{labels_csv}: curve {row.curve!r} is labelled stable but has an onset ({row.onset})")
    out = []
    for row in labels.itertuples():
        v = values[values["curve"] == row.curve].sort_values("step")
        if v.empty:
            raise AnalysisError(f"{curves_csv}: no points for curve {row.curve!r}")
        # digitized curves have uneven steps: resample to one value per unit step by linear interpolation
        steps = v["step"].to_numpy(float)
        grid = np.arange(math.ceil(steps[0]), math.floor(steps[-1]) + 1)
        y = np.interp(grid, steps, v["reward"].to_numpy(float)) if len(grid) > 1 else v["reward"].to_numpy(float)
        onset = float(row.onset) - grid[0] if row.label != "stable" and pd.notna(row.onset) else math.nan
        out.append(LabelledCurve(str(row.curve), row.label, row.label, onset, y, math.nan))
    return out


def labelled_sets(data_dir: Path = DATA_DIR) -> dict[str, list[LabelledCurve]]:
    return {p.name[: -len("_labels.csv")]: load_labelled(p) for p in sorted(Path(data_dir).glob("*_labels.csv"))}


def export_curves(experiment: str, tracking_uri: str | None, path: Path, cfg: AnalysisConfig | None = None) -> int:
    """Write the reward curves of ``experiment``'s training runs as ``<set>_curves.csv`` (curve =
    ``<group label>/seed<k>``, step, reward), for labelling by eye; returns the number of curves."""
    from .load import load_experiment

    cfg = cfg or AnalysisConfig()
    exp = load_experiment(experiment, tracking_uri, metrics=(cfg.reward_metric,))
    rows = []
    for run in exp.runs.itertuples():
        s = exp.series(cfg.reward_metric, run.run_id)
        rows += [{"curve": f"{run.label}/seed{run.seed}", "step": int(k), "reward": round(float(v), 6)}
                 for k, v in s.items()]
    path = Path(path)
    if not path.name.endswith("_curves.csv"):
        raise AnalysisError(f"{path}: the file name must end in _curves.csv (its labels go in *_labels.csv)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"# reward curves (`{cfg.reward_metric}`) of the training runs of MLflow experiment `{experiment}`\n")
        pd.DataFrame(rows, columns=["curve", "step", "reward"]).to_csv(f, index=False)
    return len(exp.runs)


def disagreements(r: SetResult, tol: float = ONSET_TOL) -> pd.DataFrame:
    """The labelled curves where the rule and the label differ: another verdict, or a found collapse whose onset
    is more than ``tol`` steps from the labelled one."""
    f = pd.DataFrame(r.rows)
    f = f[f["label"] != ""]
    err = (f["rule_onset"] - f["onset"]).abs()
    differ = (f["verdict"] != f["label"].map(VERDICT)) | ((f["label"] == "collapse") & f["flagged"] & (err > tol))
    out = f[differ]
    return pd.DataFrame({"curve": out["curve"], "label": out["label"], "label onset": out["onset"].map(lambda x: fmt(x, 0)),
                         "verdict": out["verdict"], "rule onset": out["rule_onset"].map(lambda x: fmt(x, 0)),
                         "change point": out["cp_onset"].map(lambda x: fmt(x, 0)),
                         "noise sd (smoothed)": out["sigma_S"].map(fmt), "margin": out["margin"].map(fmt)})


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def summary_frame(results: list[SetResult]) -> pd.DataFrame:
    return pd.DataFrame([{
        "set": r.name, "curves": r.curves, "labelled collapse": r.positives, "flagged": r.flagged, "true flags": r.tp,
        "precision": fmt(r.precision), "recall": fmt(r.recall),
        "verdict = label": f"{r.agree}/{r.curves - r.by_kind.get('grey', (0,))[0]}",
        "median |onset error| (rule)": fmt(r.onset_err_median, 1), "median |onset error| (change point)": fmt(r.cp_err_median, 1),
    } for r in results])


def kinds_frame(r: SetResult) -> pd.DataFrame:
    from .benchmark import LABEL

    return pd.DataFrame([{"kind": k, "label": LABEL.get(k, k) or "(grey: none)", "curves": n, "flagged collapse": fl,
                          "transient dip": tr} for k, (n, fl, tr) in r.by_kind.items()])


def run(n: int = N_DEFAULT, seed: int = SEED_DEFAULT, cfg: AnalysisConfig | None = None, data_dir: Path = DATA_DIR,
        with_cp: bool = True) -> list[SetResult]:
    cfg = cfg or AnalysisConfig()
    results = [evaluate("synthetic", synthetic_set(n, seed), cfg, with_cp)]
    for name, curves in labelled_sets(data_dir).items():
        results.append(evaluate(name, curves, cfg, with_cp))
    return results


def print_results(results: list[SetResult], cfg: AnalysisConfig, n: int, seed: int) -> None:
    from .tables import Table

    t = Table("validate", "Collapse detector against labelled curves", summary_frame(results), pd.DataFrame(),
              short_footer=cfg.describe_short())
    print(f"\n== collapse detector v2 against labelled curves (synthetic: n={n}, seed={seed}) ==")
    print(t.grid())
    for r in results:
        print(f"\n-- {r.name}: verdicts by kind --")
        print(Table("k", "", kinds_frame(r), pd.DataFrame()).grid())
        if r.name != "synthetic":
            d = disagreements(r)
            print(f"\n-- {r.name}: where the rule and the labels differ (other verdict, or onset > {ONSET_TOL} steps off) --")
            print(Table("d", "", d, pd.DataFrame()).grid() if len(d) else "(none)")
    print()
    print(cfg.describe_short())
