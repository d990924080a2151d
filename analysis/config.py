"""The analysis parameters: one frozen dataclass, one home for the defaults (docs/design.md section 5).

Every table the analysis writes is followed by :meth:`AnalysisConfig.describe`, so a number is never
separated from the definition that produced it. Override from the CLI with ``--set key=value``
(repeatable) or ``--config file.yaml`` (a flat mapping of the same keys).

Defaults and their meaning:

- ``smooth_window`` W = 10 steps; ``smooth_kind`` ``centred`` (centred moving average, partial
  windows at the ends) or ``ema`` (alpha = 2 / (W + 1)).
- Collapse (drop-from-peak rule v2, ``analysis.measures.detect``): margin below the running peak P
  of the smoothed reward ``m = max(z * sigma / sqrt(W), f * (P - R0))``, sigma the robust per-step
  noise sd of the run's raw reward (``harness.curves.noise_sd``): ``collapse_noise_z`` z = 7 (no
  flag on 1800 flat noisy curves, sd 0.01-0.08, 150-1000 steps; z = 6 flags a few of them),
  ``collapse_gain_frac`` f = 0.2 (a fifth of what the run learned). Below-the-line stretches joined
  across gaps shorter than ``collapse_gap`` (10) steps, kept when at least ``collapse_persist`` (5)
  logged steps long; reaching the end of the run (and the median of the last ``collapse_persist`` raw
  rewards below the line) = persistent collapse, ending before = transient dip. A non-finite ``policy/loss`` (or reward) at step s is a collapse at s. Benchmark:
  ``python -m analysis validate`` (docs/analysis.md).
- Change point: ``ruptures.KernelCPD(kernel="linear")`` (the l2 / mean-shift cost) on the raw reward,
  penalty ``cp_pen_scale * sigma^2 * ln(T)``, minimum segment ``cp_min_size``; the estimate is the
  first break after the peak whose segment mean drops by more than the rule's margin at the peak.
- Convergence step: first step with ``smoothed >= R0 + tau * (target - R0)``, ``converge_tau`` 0.9,
  target = the best group IQM of the final reward in the comparison.
- Final reward: mean of the raw reward over the last ``final_window`` logged steps.
- Across seeds: IQM (25 % trimmed mean), stratified bootstrap percentile CIs at ``ci`` (0.95) with
  ``bootstrap_reps`` resamples (``curve_reps`` for per-step bands), numpy generator seeded with
  ``seed``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness import curves
from harness import metrics as M
from harness.collapse import CollapseRule

_RULE = CollapseRule()  # the collapse rule's defaults: one home, harness/collapse.py


class ConfigError(ValueError):
    """An invalid analysis parameter (the CLI exits with status 2)."""


@dataclass(frozen=True)
class AnalysisConfig:
    # metrics the definitions read
    reward_metric: str = M.REWARD_MEAN
    loss_metric: str = M.POLICY_LOSS
    kl_metric: str = M.MISMATCH_K3
    time_metric: str = M.TIME_STEP
    # smoothing
    smooth_window: int = _RULE.smooth_window
    smooth_kind: str = _RULE.smooth_kind
    # collapse: drop-from-peak rule v2 (margin from the run's own noise and gain; harness.collapse)
    collapse_noise_z: float = _RULE.collapse_noise_z
    collapse_gain_frac: float = _RULE.collapse_gain_frac
    collapse_persist: int = _RULE.collapse_persist
    collapse_gap: int = _RULE.collapse_gap
    # collapse onset: change-point estimate (ruptures)
    cp_pen_scale: float = 3.0
    cp_min_size: int = 5
    # convergence
    converge_tau: float = 0.9
    # end-of-run summary
    final_window: int = curves.DEFAULT_FINAL_WINDOW
    # across seeds
    ci: float = 0.95
    bootstrap_reps: int = 10_000
    curve_reps: int = 500
    seed: int = 0
    # verdicts (analysis/verdicts.py): family-wise error, seeds below which a pair is "too few seeds", the
    # endpoints tested per pair (comma-separated: collapse, final, auc), the power the plans aim at
    alpha: float = 0.05
    min_seeds: int = 5
    endpoints: str = "collapse,final"
    power: float = 0.8
    # figures
    dpi: int = 100

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"analysis config: {what}")

        need(self.smooth_window >= 1, f"smooth_window must be >= 1, got {self.smooth_window}")
        need(self.smooth_kind in ("centred", "ema"), f"smooth_kind must be centred|ema, got {self.smooth_kind!r}")
        need(self.collapse_noise_z > 0, f"collapse_noise_z must be > 0, got {self.collapse_noise_z}")
        need(0 < self.collapse_gain_frac < 1, f"collapse_gain_frac must be in (0, 1), got {self.collapse_gain_frac}")
        need(self.collapse_persist >= 1, f"collapse_persist must be >= 1, got {self.collapse_persist}")
        need(self.collapse_gap >= 1, f"collapse_gap must be >= 1, got {self.collapse_gap}")
        need(self.cp_pen_scale > 0, f"cp_pen_scale must be > 0, got {self.cp_pen_scale}")
        need(self.cp_min_size >= 2, f"cp_min_size must be >= 2, got {self.cp_min_size}")
        need(0 < self.converge_tau <= 1, f"converge_tau must be in (0, 1], got {self.converge_tau}")
        need(self.final_window >= 1, f"final_window must be >= 1, got {self.final_window}")
        need(0 < self.ci < 1, f"ci must be in (0, 1), got {self.ci}")
        need(self.bootstrap_reps >= 100, f"bootstrap_reps must be >= 100, got {self.bootstrap_reps}")
        need(self.curve_reps >= 50, f"curve_reps must be >= 50, got {self.curve_reps}")
        need(self.dpi >= 20, f"dpi must be >= 20, got {self.dpi}")
        need(0 < self.alpha < 1, f"alpha must be in (0, 1), got {self.alpha}")
        need(self.min_seeds >= 2, f"min_seeds must be >= 2, got {self.min_seeds}")
        need(bool(self.endpoint_list) and set(self.endpoint_list) <= {"collapse", "final", "auc"},
             f"endpoints must be a comma-separated subset of collapse,final,auc, got {self.endpoints!r}")
        need(0 < self.power < 1, f"power must be in (0, 1), got {self.power}")

    @property
    def endpoint_list(self) -> tuple[str, ...]:
        return tuple(e.strip() for e in self.endpoints.split(",") if e.strip())

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: "AnalysisConfig | None" = None) -> "AnalysisConfig":
        """A config from ``{key: value}`` (values may be strings, cast to the field's type)."""
        base = base or cls()
        known = {f.name: f for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"analysis config: unknown key {key!r}; known keys: {', '.join(known)}")
            default = getattr(base, key)
            changes[key] = _cast(key, value, type(default))
        return dataclasses.replace(base, **changes)

    @classmethod
    def from_overrides(cls, overrides: Iterable[str], base: "AnalysisConfig | None" = None) -> "AnalysisConfig":
        """A config from ``["key=value", ...]`` (the CLI's ``--set``)."""
        values: dict[str, str] = {}
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"analysis config: override {item!r} is not key=value")
            key, value = item.split("=", 1)
            values[key.strip()] = value.strip()
        return cls.from_mapping(values, base)

    @classmethod
    def from_yaml(cls, path: str | Path, base: "AnalysisConfig | None" = None) -> "AnalysisConfig":
        """A config from a flat YAML mapping of the same keys."""
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"analysis config: {path} must hold a mapping of keys to values")
        return cls.from_mapping(data, base)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- the footer under every table ---------------------------------------------------------
    def describe_short(self) -> str:
        """One line of the parameters (under tables in the terminal and in report.md)."""
        return (
            f"Parameters: W={self.smooth_window} ({self.smooth_kind}); collapse v2: margin max({self.collapse_noise_z:g}*"
            f"sigma/sqrt W, {self.collapse_gain_frac:g}*(P-R0)), >= {self.collapse_persist} steps to the end (persistent; "
            f"recovered = transient dip), gaps < {self.collapse_gap} joined, or non-finite loss; change point "
            f"pen={self.cp_pen_scale:g}*sigma^2*lnT, min_size={self.cp_min_size}, min drop = the margin; "
            f"convergence tau={self.converge_tau:g}; final = last {self.final_window} steps; IQM, {self.ci:.0%} "
            f"stratified bootstrap CI ({self.bootstrap_reps} resamples, seed {self.seed}); verdicts: paired where "
            f"seeds pair, Holm per family at {self.alpha:g}, >= {self.min_seeds} seeds."
        )

    def describe(self) -> str:
        """The definitions and parameters, in the words printed under every table."""
        smooth = (
            f"centred moving average, W={self.smooth_window}"
            if self.smooth_kind == "centred"
            else f"EMA, alpha=2/(W+1), W={self.smooth_window}"
        )
        lo, hi = (1 - self.ci) / 2 * 100, (1 + self.ci) / 2 * 100
        return "\n".join(
            [
                f"Parameters: reward = `{self.reward_metric}`, smoothed by {smooth}; R0 = smoothed reward at the first step.",
                f"Collapse (rule v2): smoothed < P - m, m = max({self.collapse_noise_z:g}*sigma/sqrt(W), "
                f"{self.collapse_gain_frac:g}*(P-R0)) (P = running peak, sigma = median|diff r|/0.6745/sqrt 2, the run's "
                f"own noise); stretches joined across gaps < {self.collapse_gap} steps and >= {self.collapse_persist} steps "
                f"long; one that lasts to the end of the run = persistent collapse (onset = start of its descent, where "
                f"smoothed < P - 3m/4) when the median of the last "
                f"{self.collapse_persist} raw rewards is below the line too, one that recovers = transient dip (not a collapse); or a non-finite "
                f"`{self.loss_metric}`/reward; censored at the last step otherwise.",
                f"Change point: ruptures KernelCPD(linear) on the raw reward, pen={self.cp_pen_scale:g}*sigma^2*ln T, "
                f"min_size={self.cp_min_size}; first break after the peak with a mean drop > the rule's margin.",
                f"Convergence: first step with smoothed >= R0 + {self.converge_tau:g}*(target-R0), target = best group "
                f"IQM of the final reward; censored if never. Final = mean raw reward of the last {self.final_window} steps; "
                f"AUC = trapezoid area / step span (mean reward over the run).",
                f"Across seeds: IQM (25% trimmed mean); {self.ci:.0%} CI = stratified bootstrap percentile "
                f"[{lo:g}, {hi:g}] ({self.bootstrap_reps} resamples, {self.curve_reps} for curves, seed {self.seed}); "
                f"survival = Kaplan-Meier share not yet collapsed.",
                f"Verdicts: paired tests on common seeds (McNemar exact: collapse; Wilcoxon signed-rank: "
                f"{', '.join(e for e in self.endpoint_list if e != 'collapse') or 'no reward endpoint'}), unpaired "
                f"(Fisher exact, Mann-Whitney U) where groups do not pair; Holm within each family (primary, "
                f"exploratory), BH q beside; separates = Holm p < {self.alpha:g}; < {self.min_seeds} seeds = too few "
                f"seeds. Horizon: collapse again with the last 5% / 10% of steps cut; late = onset in the last 10%.",
            ]
        )


def _cast(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    try:
        if kind is bool:
            return str(value).lower() in ("1", "true", "yes", "on")
        if kind is int:
            as_float = float(value)
            if as_float != int(as_float):
                raise ValueError
            return int(as_float)
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"analysis config: {key}={value!r} is not a valid {kind.__name__}") from None
