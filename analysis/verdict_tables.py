"""The report's verdicts as tables (the tests themselves: :mod:`analysis.verdicts`; power: :mod:`analysis.power`).

- ``verdicts``: every comparison of the report, family by family (primary first): the pair or trend, endpoint,
  test, seeds, effect with its simultaneous interval, raw p, Holm p, BH q, verdict, and for collapse verdicts
  whether they hold with the last 5% / 10% of the steps cut.
- ``separation``: the comparisons that separate (Holm p < alpha), with counts per family, the power statement
  (the smallest differences each family could detect at its seed counts) and what "too few seeds" left out.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from . import power
from .config import AnalysisConfig
from .labels import default_axes, family_name, sweep_families
from .load import Experiment
from .tables import Table
from .verdicts import SEPARATES, TOO_FEW, Comparison, frame, verdicts

def ordered_families(exp: Experiment, axes: Sequence[str] = ()) -> dict[str, list[tuple[float, str]]]:
    """The ordered sweep families of the experiment (>= 3 levels of one axis): ``{name over x: [(x, label)]}``.
    The axes: the knobs the registry declares axes (``n``, ``clip_c``), then ``axes`` (``report --x``)."""
    out = {}
    for x in dict.fromkeys((*default_axes(), *axes)):
        if x not in exp.runs:
            continue
        for g in sweep_families(exp.runs, x, None).values():
            levels = sorted({(float(v), lab) for v, lab in zip(g[x], g["label"])})
            if len({v for v, _ in levels}) >= 3:
                out[f"{family_name(g, x)} over {x}"] = levels
    return out


def run_verdicts(exp: Experiment, measures: pd.DataFrame, cfg: AnalysisConfig,
                 primary: Iterable[tuple] = (), axes: Sequence[str] = ()) -> list[Comparison]:
    """Every comparison of ``exp`` (pairs on each endpoint, ordered trends), families, Holm/BH and verdicts."""
    return verdicts(measures, exp.labels, exp.runs, alpha=cfg.alpha, min_seeds=cfg.min_seeds,
                    endpoints=cfg.endpoint_list, primary=primary, trends=ordered_families(exp, axes),
                    reps=cfg.bootstrap_reps, seed=cfg.seed)


def _fmt_p(p: float) -> str:
    if p is None or not np.isfinite(p):
        return "-"
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def _what(c: Comparison) -> str:
    return f"{c.a} vs {c.b}" if c.kind == "pair" else f"trend: {c.a} ({c.b})"


def _seeds(c: Comparison) -> str:
    if c.kind == "trend":
        return f">= {c.n_a} per level" + (f", {c.n_pairs} paired" if c.paired else "")
    return f"{c.n_pairs} paired" if c.paired else f"{c.n_a} vs {c.n_b}"


def _effect(c: Comparison) -> str:
    if c.kind == "trend":
        return {1.0: "up with x", -1.0: "down with x"}.get(c.effect, "none")
    if not np.isfinite(c.effect):
        return "n/a"
    if np.isfinite(c.lo) and np.isfinite(c.hi):
        iv = f" [{c.lo:+.2f}, {c.hi:+.2f}]"
    else:
        iv = " [unbounded]" if np.isinf(c.lo) or np.isinf(c.hi) else ""
    return f"{c.effect:+.2f}{iv}"


def _horizon(c: Comparison) -> str:
    if c.verdict != SEPARATES or c.endpoint != "collapse" or c.kind != "pair":
        return ""
    return f"-5%: {c.holds_h95 or '?'}, -10%: {c.holds_h90 or '?'}"


def verdicts_table(comparisons: Sequence[Comparison], cfg: AnalysisConfig) -> Table:
    order = {"primary": 0, "exploratory": 1, "none": 2}
    cs = sorted(comparisons, key=lambda c: (order[c.family], c.p if np.isfinite(c.p) else 2.0))
    rows = [{"family": c.family if c.family != "none" else "-", "comparison": _what(c), "endpoint": c.endpoint,
             "test": c.test, "seeds": _seeds(c), "effect A - B [simult. CI]": _effect(c), "p": _fmt_p(c.p),
             "Holm p": _fmt_p(c.p_holm), "BH q": _fmt_p(c.q_bh), "verdict": c.verdict, "horizon": _horizon(c)}
            for c in cs]
    t = Table("verdicts", f"Every comparison: paired where seeds pair, Holm per family (alpha {cfg.alpha:g})",
              pd.DataFrame(rows), frame(cs), cfg.describe(), short_footer=cfg.describe_short())
    t.notes.append("effect: collapse-rate difference, or reward shift A - B (paired: Hodges-Lehmann; unpaired: "
                   "difference of means), with its interval at the simultaneous level 1 - alpha/m of its family (m "
                   "tests; paired: the inverted exact test, unbounded where n seeds cannot reach the level); a "
                   "trend's effect is its direction. "
                   "horizon: whether a separating collapse verdict holds with the last 5% / 10% of steps cut.")
    return t


def power_lines(comparisons: Sequence[Comparison], cfg: AnalysisConfig) -> list[str]:
    """Per family: its size, typical seeds, and the smallest differences it could detect at ``cfg.power``."""
    lines = []
    for fam in ("primary", "exploratory"):
        members = [c for c in comparisons if c.family == fam and c.kind == "pair"]
        if not members:
            continue
        m = sum(c.family == fam for c in comparisons)
        paired = [c for c in members if c.paired]
        n = int(np.median([c.n_pairs if c.paired else min(c.n_a, c.n_b) for c in members]))
        is_paired = len(paired) >= len(members) / 2
        r0 = power.smallest_rate_detectable(n, 0.0, is_paired, cfg.alpha, m, cfg.power)
        r1 = power.smallest_rate_detectable(n, 0.1, is_paired, cfg.alpha, m, cfg.power)
        shift = power.smallest_shift_detectable(n, cfg.alpha, m, cfg.power)
        rate = lambda v, b: (f"a collapse rate of {v:.2f} against {b:g}" if math.isfinite(v)  # noqa: E731
                             else f"no collapse-rate difference against {b:g} (not even 1.0)")
        shift_txt = f"{shift:.2f}" if math.isfinite(shift) else "no"
        lines.append(f"{fam} family: {m} tests, {n} {'paired ' if is_paired else ''}seeds per comparison (median); "
                     f"at {cfg.power:.0%} power it detects {rate(r0, 0)} and {rate(r1, 0.1)} "
                     f"({'McNemar' if is_paired else 'Fisher'} exact at alpha/{m}), and a paired final-reward shift "
                     f"of {shift_txt} sd of the per-seed differences (Wilcoxon; `python -m analysis power` for other "
                     "designs).")
    return lines


def separation_table(comparisons: Sequence[Comparison], cfg: AnalysisConfig) -> Table:
    """The comparisons that separate, with counts per family, the power statement and the too-few-seeds count."""
    sep = [c for c in comparisons if c.verdict == SEPARATES]
    sep.sort(key=lambda c: (c.family != "primary", c.p_holm))
    rows = [{"family": c.family, "comparison": _what(c), "endpoint": c.endpoint, "test": c.test, "seeds": _seeds(c),
             "effect A - B [simult. CI]": _effect(c), "Holm p": _fmt_p(c.p_holm), "horizon": _horizon(c)}
            for c in sep]
    t = Table("separation", f"Comparisons that separate (Holm-adjusted p < {cfg.alpha:g} within their family)",
              pd.DataFrame(rows, columns=["family", "comparison", "endpoint", "test", "seeds",
                                          "effect A - B [simult. CI]", "Holm p", "horizon"]),
              frame(sep), cfg.describe(), short_footer=cfg.describe_short())
    for fam in ("primary", "exploratory"):
        members = [c for c in comparisons if c.family == fam]
        if members:
            k = sum(c.verdict == SEPARATES for c in members)
            t.notes.append(f"{fam}: {k} of {len(members)} tests separate; the others are not shown (Holm, family-wise "
                           f"error <= {cfg.alpha:g}; BH q-values in verdicts.md).")
    few = [c for c in comparisons if c.verdict == TOO_FEW]
    if few:
        t.notes.append(f"{len(few)} comparisons have fewer than {cfg.min_seeds} seeds in a group (paired: common "
                       "seeds): too few seeds, not tested, never 'separates'.")
    if not any(c.family in ("primary", "exploratory") for c in comparisons):
        t.notes.append("no comparison has enough seeds to be tested: nothing can separate here.")
    t.notes += power_lines(comparisons, cfg)
    return t


def trend_families_from_labels(labels: Sequence[str], specs: Sequence[str]) -> dict[str, list[tuple[float, str]]]:
    """Ordered families named by a pattern with one ``*`` standing for the ordered value: ``mean_n(n=*)``,
    ``recompute[router=*]``, ``recompute[router@k3=*]``; ``;LABEL=VALUE`` adds a control arm at a level
    (``recompute[router=*];recompute[none]=0``). ``{pattern: [(value, label)]}``, >= 3 levels each."""
    import re

    from .config import ConfigError

    out = {}
    for spec in specs:
        pattern, *extras = spec.split(";")
        if pattern.count("*") != 1:
            raise ConfigError(f"--trend {spec!r}: write the labels with one '*' for the ordered value, e.g. "
                              "'mean_n(n=*)' or 'recompute[router=*];recompute[none]=0'")
        rx = re.compile("^" + re.escape(pattern).replace(r"\*", r"([-+0-9.eE]+)") + "$")
        levels = []
        for lab in labels:
            m = rx.match(lab)
            if m:
                try:
                    levels.append((float(m.group(1)), lab))
                except ValueError:
                    pass
        for extra in extras:
            lab, _, val = extra.rpartition("=")
            if lab not in labels:
                raise ConfigError(f"--trend {spec!r}: no group {lab!r}")
            levels.append((float(val), lab))
        if len({v for v, _ in levels}) < 3:
            raise ConfigError(f"--trend {spec!r}: fewer than 3 levels match among the groups")
        out[pattern] = sorted(levels)
    return out


def verdicts_from_runs(path: str, cfg: AnalysisConfig, primary: Sequence[tuple], trends: Sequence[str],
                       out: str | None, versus: str | None = None) -> int:
    """``python -m analysis verdicts``: the verdicts of a committed per-run table (a report's runs.csv), no store.
    Without per-step histories the horizon check uses the table's ``collapsed_h95``/``collapsed_h90`` columns when
    present (reports from this version on), and says so when absent."""
    from pathlib import Path

    from .config import ConfigError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--runs {path}: no such file (a report's runs.csv)")
    m = pd.read_csv(p)
    need = {"label", "seed", "collapsed", "final"}
    if not need <= set(m.columns):
        raise ConfigError(f"--runs {path}: needs the columns {', '.join(sorted(need))} of a report's runs.csv")
    m["collapsed"] = m["collapsed"].astype(str).str.lower().isin(("true", "1", "1.0"))
    for col in ("collapsed_h95", "collapsed_h90"):
        if col in m:
            m[col] = m[col].astype(str).str.lower().isin(("true", "1", "1.0"))
    if "auc" not in m:
        m["auc"] = np.nan
    labels = list(dict.fromkeys(m["label"]))
    unknown = [x for pr in primary for x in (pr if pr[0] != "trend" else ()) if x not in labels]
    if unknown:
        raise ConfigError(f"--primary: no group {unknown[0]!r} in {path}; groups: {', '.join(labels)}")
    if versus is not None and versus not in labels:
        raise ConfigError(f"--versus: no group {versus!r} in {path}; groups: {', '.join(labels)}")
    families = trend_families_from_labels(labels, trends)
    lost = [pr[1] for pr in primary if pr[0] == "trend" and pr[1] not in families]
    if lost:  # here a family is named by its --trend pattern, not "<family> over <x>" as in a report
        raise ConfigError(f"--primary 'trend:{lost[0]}': no --trend family of that name; here a trend is named by its "
                          f"--trend pattern (--primary 'trend:mean_n(n=*)' with --trend 'mean_n(n=*)'); families: "
                          f"{', '.join(families) or 'none'}")
    if "late" not in m and {"onset", "first_step", "last_step"} <= set(m.columns):
        span = m["last_step"] - m["first_step"]
        m["late"] = m["collapsed"] & (m["onset"] >= m["first_step"] + 0.9 * span)
    cs = verdicts(m, labels, None, alpha=cfg.alpha, min_seeds=cfg.min_seeds, endpoints=cfg.endpoint_list,
                  primary=primary, trends=families, reps=cfg.bootstrap_reps,
                  seed=cfg.seed, versus=versus)
    tables = [separation_table(cs, cfg), verdicts_table(cs, cfg)]
    note = (f"from {p} (per-run measures only): groups pair on seeds (one model and task per table assumed)"
            + ("" if "collapsed_h90" in m else "; no horizon columns, so no horizon check")
            + (f"; pairs: every group against {versus} only (a many-to-one family)" if versus else ""))
    if "late" in m:
        late = {lab: (int(g["late"].sum()), int(g["collapsed"].sum())) for lab, g in m.groupby("label", sort=False)}
        note += "; late collapses (onset in the last 10% of steps) / collapses: " + ", ".join(
            f"{lab} {a}/{b}" for lab, (a, b) in late.items() if b)
    for t in tables:
        t.notes.insert(0, note)
        if out:
            t.write(Path(out))
        print(t.terminal())
    return 0
