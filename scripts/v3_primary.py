"""Issue 31's pre-registered contrasts, one table for both conditions (docs/preregistration.md sections 2-5).

Reads each condition's report folder (``verdicts.csv``: the primary family's tests and Holm p-values; ``runs.csv``:
per-run collapse flags) and writes one row per hypothesis and condition: the collapse counts of the two arms, the
paired tests' p-values with Holm's adjustment in brackets, the final-reward shift (Hodges-Lehmann, A - B) with its
simultaneous interval, and the verdict ("separates" on an endpoint when its Holm p < alpha, else "not shown").
Under the table, per condition: the family's size, its paired seeds and its minimum detectable differences at 80%
power (``analysis.power``, the report's own power statement), and the conservative-update control's reading
(``scripts/conservative_control.py``). The layout was fixed before any outcome was seen; nothing here chooses what
to show from the results.

    python scripts/v3_primary.py docs/results/v3_sparse docs/results/v3_bias --out docs/results/v3_primary

writes ``v3_primary.md`` and ``v3_primary.csv``, and the forest plot of the pair hypotheses' effects with their
simultaneous intervals (``v3_primary.pdf``/``.png``: both conditions, both endpoints); the README holds the Markdown table as a generated block
(``python -m analysis readme README.md`` refreshes it). A folder whose report lacks a primary pair is an error
(exit 2): its report was made before every run finished, or from another experiment.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import power  # noqa: E402

_cc = importlib.util.spec_from_file_location("conservative_control", Path(__file__).with_name("conservative_control.py"))
cc = importlib.util.module_from_spec(_cc)
_cc.loader.exec_module(cc)

BASE, DAMPED, MEAN8, ROLLOUT = cc.BASE, cc.DAMPED, cc.MEAN8, cc.ROLLOUT
TIS, R3, TREND = "tis(C=2,token)", "r3", "mean_n over n"  # TREND: the sweep's `trend: mean_n over n`
#: the hypotheses as docs/preregistration.md section 2 writes them: (id, A, B); B = mean_8 becomes rollout where the
#: condition has no mean_8 arm (bias only: mean_n(n=8) is rollout bitwise there, amendment 2)
HYPOTHESES = [("H1", BASE, MEAN8), ("H2", ROLLOUT, MEAN8), ("H3", TIS, MEAN8), ("H4", R3, BASE),
              ("H5", DAMPED, MEAN8), ("H6", "trend", TREND)]
SHORT = {BASE: "recompute", DAMPED: "recompute, lr/2", MEAN8: "mean_8", ROLLOUT: "rollout", TIS: "TIS", R3: "R3",
         TREND: "mean_n over n = 1, 2, 4, 8"}
CONDITION = {"v3_sparse": "sparse noise", "v3_bias": "bias only"}


class BriefError(Exception):
    pass


def _p(p: float, holm: float) -> str:
    fmt = lambda x: "-" if not math.isfinite(x) else f"{x:.2g}" if x >= 0.001 else f"{x:.1e}"  # noqa: E731
    return f"{fmt(p)} ({fmt(holm)})"


def _shift(row: pd.Series) -> str:
    lo, hi = float(row["lo"]), float(row["hi"])
    ci = "unbounded" if not (math.isfinite(lo) and math.isfinite(hi)) else f"{lo:+.2f}, {hi:+.2f}"
    return f"{float(row['effect']):+.3f} [{ci}]"


def _pair_rows(v: pd.DataFrame, a: str, b: str) -> dict[str, pd.Series]:
    """The primary rows of (a, b) per endpoint, signed as a - b (``conservative_control._pair``)."""
    return {r["endpoint"]: r for _, r in cc._pair(v, a, b).iterrows()}


def _verdict(rows: dict[str, pd.Series]) -> str:
    sep = [ep for ep in ("collapse", "final") if ep in rows and rows[ep]["verdict"] == "separates"]
    if sep:
        return "**separates**: " + ", ".join(sep)
    few = any(r["verdict"] == "too few seeds" for r in rows.values())
    return "too few seeds" if few else "not shown"


def condition_rows(folder: Path) -> list[dict]:
    """One row per hypothesis of the condition whose report is in ``folder``."""
    v = pd.read_csv(folder / "verdicts.csv")
    runs = pd.read_csv(folder / "runs.csv")
    name = CONDITION.get(folder.name, folder.name)
    has_mean8 = (runs["label"] == MEAN8).any()
    counts = runs.groupby("label")["collapsed"].agg(["sum", "count"])

    def collapsed(label: str) -> str:
        return f"{int(counts.loc[label, 'sum'])}/{int(counts.loc[label, 'count'])}" if label in counts.index else "-"

    out = []
    for hid, a, b in HYPOTHESES:
        row = {"H": hid, "condition": name}
        if hid == "H6":
            t = v[(v["kind"] == "trend") & (v["family"] == "primary")]  # the one primary trend
            if not has_mean8 or t.empty:
                out.append({**row, "contrast": SHORT[TREND], "collapsed A / B": "-", "collapse p (Holm)": "-",
                            "final A - B [CI]": "-", "final p (Holm)": "-",
                            "verdict": "not tested: mean_n's passes are identical here" if not has_mean8
                            else "not in the report"})
                continue
            by = {r["endpoint"]: r for _, r in t.iterrows()}
            levels = sorted(lab for lab in counts.index if lab.startswith("mean_n(n="))
            levels.sort(key=lambda lab: float(lab[len("mean_n(n="):-1]))
            out.append({**row, "contrast": SHORT[TREND],
                        "collapsed A / B": ", ".join(collapsed(lab) for lab in levels),
                        "collapse p (Holm)": _p(by["collapse"]["p"], by["collapse"]["p_holm"]) + " CA",
                        "final A - B [CI]": f"{'rises' if by['final']['effect'] > 0 else 'falls' if by['final']['effect'] < 0 else 'flat'} with n",
                        "final p (Holm)": _p(by["final"]["p"], by["final"]["p_holm"]) + f" {by['final']['test']}",
                        "verdict": _verdict(by)})
            continue
        if not has_mean8 and b == MEAN8:
            if a == ROLLOUT:
                out.append({**row, "contrast": f"{SHORT[a]} vs {SHORT[b]}", "collapsed A / B": "-",
                            "collapse p (Holm)": "-", "final A - B [CI]": "-", "final p (Holm)": "-",
                            "verdict": "not tested: mean_8 is rollout bitwise here"})
                continue
            b = ROLLOUT
        rows = _pair_rows(v, a, b)
        if set(rows) != {"collapse", "final"}:
            raise BriefError(f"{folder}/verdicts.csv: the primary pair {a} | {b} ({hid}) is not there on both "
                             "endpoints: make the report after every run of the sweep finished (make study)")
        out.append({**row, "contrast": f"{SHORT[a]} vs {SHORT[b]}",
                    "collapsed A / B": f"{collapsed(a)} vs {collapsed(b)}",
                    "collapse p (Holm)": _p(rows["collapse"]["p"], rows["collapse"]["p_holm"]),
                    "final A - B [CI]": _shift(rows["final"]),
                    "final p (Holm)": _p(rows["final"]["p"], rows["final"]["p_holm"]),
                    "verdict": _verdict(rows)})
    return out


def registration(folder: Path) -> str:
    """What the report's notes say of the primary contrasts' declaration (``analysis.report.primary_note``): when,
    and whether before the experiment's first run ("pre-registered") or after; "" where the folder has no report."""
    path = folder / "report.md"
    if not path.exists():
        return ""
    m = re.search(r"declared by the sweep at ([^,]+), (before the first run started: pre-registered|after runs of "
                  r"this experiment had started: labelled primary, not pre-registered)", path.read_text())
    return f"declared at {m.group(1)}, {m.group(2)}" if m else "no declaration before the runs: not pre-registered"


def footer(folder: Path, alpha: float = 0.05, target: float = 0.8) -> str:
    """The condition's family size, paired seeds, minimum detectable differences and H5's reading."""
    v = pd.read_csv(folder / "verdicts.csv")
    prim = v[v["family"] == "primary"]
    pairs = prim[prim["kind"] == "pair"]
    m, n = len(prim), int(np.median(pairs["n_pairs"])) if len(pairs) else 0
    r0 = power.smallest_rate_detectable(n, 0.0, True, alpha, m, target)
    r1 = power.smallest_rate_detectable(n, 0.1, True, alpha, m, target)
    shift = power.smallest_shift_detectable(n, alpha, m, target)
    fmt = lambda x: f"{x:.2f}" if math.isfinite(x) else "none"  # noqa: E731
    try:
        answer = cc.reading(folder)[0]
    except SystemExit:
        answer = "not read (H1 or H5 missing)"
    reg = registration(folder)
    return (f"{CONDITION.get(folder.name, folder.name)}{' (' + reg + ')' if reg else ''}: Holm over {m} primary tests, "
            f"{n} paired seeds; detectable at "
            f"{target:.0%} power: a collapse rate of {fmt(r0)} vs 0 and {fmt(r1)} vs 0.1 (McNemar), a final-reward "
            f"shift of {fmt(shift)} sd of the paired differences (Wilcoxon); conservative-update control (H5): "
            f"{answer}.")


def effects(folders: list[Path]) -> pd.DataFrame:
    """The pair hypotheses' effects A - B with their simultaneous intervals, per condition and endpoint (the
    forest plot's data): H, condition, endpoint, effect, lo, hi, separates."""
    rows = []
    for folder in folders:
        v = pd.read_csv(folder / "verdicts.csv")
        has_mean8 = (pd.read_csv(folder / "runs.csv")["label"] == MEAN8).any()
        for hid, a, b in HYPOTHESES:
            if hid == "H6" or (not has_mean8 and a == ROLLOUT):
                continue
            b = b if has_mean8 or b != MEAN8 else ROLLOUT
            for ep, r in _pair_rows(v, a, b).items():
                rows.append({"H": hid, "contrast": f"{SHORT[a]} vs {SHORT[b]}",
                             "condition": CONDITION.get(folder.name, folder.name), "endpoint": ep,
                             "effect": float(r["effect"]), "lo": float(r["lo"]), "hi": float(r["hi"]),
                             "separates": r["verdict"] == "separates"})
    return pd.DataFrame(rows)


def forest(data: pd.DataFrame, path: Path) -> list[Path]:
    """Two panels (collapse-rate difference, final-reward shift), a row per hypothesis, a marker per condition
    (filled: separates after Holm; open: not shown), its simultaneous interval as a bar (an arrow where the
    interval is unbounded: too few seeds for its level). The intervals are at the simultaneous level 1 - alpha/m of
the family (the report's); Holm's step-down is less strict after its first step, so a contrast may separate while
its interval touches 0. Writes ``path``.pdf and .png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    hyps = sorted(data["H"].unique())
    conds = list(dict.fromkeys(data["condition"]))
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 0.55 * len(hyps) + 1.6), sharey=True)
    for ax, ep, title, span in ((axes[0], "collapse", "collapse rate, A - B", 1.0),
                                (axes[1], "final", "final reward, A - B (Hodges-Lehmann)", None)):
        d = data[data["endpoint"] == ep]
        finite = np.concatenate([d["lo"], d["hi"], d["effect"]])
        finite = finite[np.isfinite(finite)]
        lim = span if span is not None else max(0.05, 1.1 * float(np.abs(finite).max()) if len(finite) else 0.1)
        for j, cond in enumerate(conds):
            off = (j - (len(conds) - 1) / 2) * 0.25
            for _, r in d[d["condition"] == cond].iterrows():
                y = hyps.index(r["H"]) + off
                lo = r["lo"] if np.isfinite(r["lo"]) else -lim
                hi = r["hi"] if np.isfinite(r["hi"]) else lim
                ax.plot([lo, hi], [y, y], color=colours[j % 4], lw=1.4)
                for end, ok, mark in ((lo, np.isfinite(r["lo"]), "<"), (hi, np.isfinite(r["hi"]), ">")):
                    if not ok:
                        ax.plot([end], [y], marker=mark, color=colours[j % 4], ms=5)
                ax.plot([r["effect"]], [y], marker="o", ms=7, color=colours[j % 4],
                        markerfacecolor=colours[j % 4] if r["separates"] else "white")
        ax.axvline(0.0, color="0.4", lw=0.8, ls=":")
        ax.set_xlim(-lim, lim)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, symmetric=True))  # few ticks: labels never run together
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    def ylabel(h: str) -> str:
        names = list(dict.fromkeys(data[data["H"] == h]["contrast"]))
        return f"{h}: {names[0]}" + "".join(f"\n({c}: {n.split(' vs ')[1]})" for c, n in
                                            zip(data[data["H"] == h]["condition"].unique()[1:], names[1:]))

    axes[0].set_yticks(range(len(hyps)), [ylabel(h) for h in hyps], fontsize=8)
    axes[0].invert_yaxis()
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[j % 4], marker="o", ms=7, label=c) for j, c in enumerate(conds)]
    handles.append(Line2D([], [], color="0.3", marker="o", ms=7, markerfacecolor="white", ls="",
                          label="open: not shown (Holm p >= 0.05)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("Pre-registered contrasts: effects with simultaneous intervals (filled: separates, Holm)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = [path.with_suffix(".pdf"), path.with_suffix(".png")]
    for o in out:
        fig.savefig(o, dpi=150)
    plt.close(fig)
    return out


def table(folders: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    rows = [r for f in folders for r in condition_rows(f)]
    cols = ["H", "contrast", "condition", "collapsed A / B", "collapse p (Holm)", "final A - B [CI]",
            "final p (Holm)", "verdict"]
    return pd.DataFrame(rows)[cols], [footer(f) for f in folders]


def markdown(df: pd.DataFrame, notes: list[str]) -> str:
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    body = "".join("| " + " | ".join(str(x) for x in r) + " |\n" for r in df.itertuples(index=False))
    return ("# Pre-registered contrasts (docs/preregistration.md), paired tests, Holm per condition\n\n" + head + body
            + "\n" + "".join(f"<sub>{n}</sub>  \n" for n in notes)
            + "<sub>collapse: persistent collapse by the last step (McNemar exact); final: mean reward of the last 10 "
              "steps, A - B as Hodges-Lehmann shift with its simultaneous interval at level 1 - alpha/m (Wilcoxon "
              "signed-rank; Holm's later steps are less strict than the interval, so a contrast may separate while "
              "its interval touches 0); H6: "
              "collapsed per level, Cochran-Armitage (CA) and Page's L. p (Holm): raw p, Holm-adjusted in "
              "brackets.</sub>\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="report folders (docs/results/v3_sparse ...)")
    ap.add_argument("--out", type=Path, required=True, help="output path without suffix (.md and .csv are written)")
    args = ap.parse_args(argv)
    for f in args.folders:
        missing = [n for n in ("verdicts.csv", "runs.csv", "along.csv") if not (f / n).exists()]
        if missing:
            print(f"v3_primary: {f}/{missing[0]}: no such file (run `python -m analysis report ... --out {f}`)",
                  file=sys.stderr)
            return 2
    try:
        df, notes = table(args.folders)
    except BriefError as exc:
        print(f"v3_primary: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out.with_suffix(".csv"), index=False)
    args.out.with_suffix(".md").write_text(markdown(df, notes))
    forest(effects(args.folders), args.out)
    print(markdown(df, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
