"""The analysis parameters: pre-registered defaults, overrides, the printed description."""
from __future__ import annotations

import pytest

from analysis.config import AnalysisConfig, ConfigError


def test_defaults_are_the_preregistered_ones():
    cfg = AnalysisConfig()
    assert cfg.smooth_window == 10 and cfg.collapse_noise_z == 7 and cfg.collapse_gain_frac == 0.2
    assert cfg.collapse_persist == 5 and cfg.collapse_gap == 10
    assert cfg.converge_tau == 0.9 and cfg.ci == 0.95
    assert cfg.reward_metric == "reward/mean" and cfg.loss_metric == "policy/loss" and cfg.kl_metric == "mismatch/k3"


def test_overrides_cast_and_validate():
    cfg = AnalysisConfig.from_overrides(["smooth_window=20", "collapse_gain_frac=0.5", "smooth_kind=ema", "seed=3"])
    assert (cfg.smooth_window, cfg.collapse_gain_frac, cfg.smooth_kind, cfg.seed) == (20, 0.5, "ema", 3)
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        AnalysisConfig.from_overrides(["nope=1"])
    with pytest.raises(ConfigError, match="not a valid int"):
        AnalysisConfig.from_overrides(["smooth_window=2.5"])
    with pytest.raises(ConfigError, match="collapse_gain_frac"):
        AnalysisConfig.from_overrides(["collapse_gain_frac=1"])
    with pytest.raises(ConfigError, match="converge_tau"):
        AnalysisConfig.from_overrides(["converge_tau=1.5"])
    with pytest.raises(ConfigError, match="key=value"):
        AnalysisConfig.from_overrides(["smooth_window"])


def test_yaml(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("collapse_persist: 30\nci: 0.9\n")
    cfg = AnalysisConfig.from_yaml(p)
    assert cfg.collapse_persist == 30 and cfg.ci == 0.9


def test_description_names_every_definition_parameter():
    cfg = AnalysisConfig.from_overrides(["collapse_persist=17", "collapse_noise_z=6.5", "converge_tau=0.85",
                                         "bootstrap_reps=1234", "seed=9"])
    for text in (cfg.describe(), cfg.describe_short()):
        for needle in ("W=10", ">= 17 steps", "6.5*sigma", "0.2*(P-R0)", "0.85", "1234", "seed 9"):
            assert needle in text, (needle, text)
