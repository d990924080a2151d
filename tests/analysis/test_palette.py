"""The palette (analysis/palette.py): every registered estimator its own colour and line style, none the
unknown gray (tab10 ran out: gmpo_rs and mean_n_tis were both gray), shades of an estimator's variants
apart in CIELAB, and every estimator in a camp."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis.palette import (BASE_COLOUR, BASE_STYLE, COLOURS, REFERENCE_COLOUR, UNKNOWN_COLOUR, Palette, camp,
                              camp_order, shade)
from harness import estimators


def test_every_registered_estimator_has_its_own_colour_and_style():
    pal = Palette([(name, name, "") for name in estimators.NAMES])
    styles = {name: (pal[name].colour, pal[name].linestyle) for name in estimators.NAMES}
    assert len(set(styles.values())) == len(estimators.NAMES), styles
    assert len({c for c, _ in styles.values()}) == len(estimators.NAMES)  # the colours alone, too
    grey = shade(UNKNOWN_COLOUR, 0.0)
    for name in estimators.NAMES:
        assert estimators.get(name).style is not None, f"{name} declares no style"
        assert estimators.get(name).style.colour in COLOURS, name
        assert name in BASE_COLOUR and name in BASE_STYLE, name
        assert styles[name][0] != grey, f"{name} is drawn in the unknown gray"


def test_base_colours_are_apart_from_each_other_and_from_the_reference_arms():
    """Any two estimators' base colours >= 25 apart (CIE76), and >= 25 from the black and gray of the reference
    arms of the small multiples."""
    refs = [shade(c, 0.0) for c in REFERENCE_COLOUR.values()]
    base = {name: shade(BASE_COLOUR[name], 0.0) for name in estimators.NAMES}
    for (a, ca), (b, cb) in itertools.combinations(base.items(), 2):
        assert float(np.linalg.norm(_lab(ca) - _lab(cb))) >= 25, (a, b)
    for name, c in base.items():
        for r in refs:
            assert float(np.linalg.norm(_lab(c) - _lab(r))) >= 25, (name, r)


def test_an_unknown_estimator_takes_a_spare_colour_not_gray():
    pal = Palette([("recompute", "recompute", ""), ("gone(x=1)", "gone", ""), ("other", "other", "")])
    colours = {pal[k].colour for k in ("recompute", "gone(x=1)", "other")}
    assert len(colours) == 3 and shade(UNKNOWN_COLOUR, 0.0) not in colours


def test_every_estimator_is_in_a_camp():
    camps = {name: camp(name) for name in estimators.NAMES}
    assert "other" not in camps.values(), camps
    assert camps["recompute"] == camps["rollout"] == "baseline"
    assert camps["tis"] == camps["mis"] == camps["icepop"] == camps["rais"] == camps["gmpo_rs"] == "re-weighting"
    assert camp("no_such_estimator") == "other" and camp_order()[-1] == "other"
    assert camp_order()[0] == "baseline"


def _lab(rgb) -> np.ndarray:
    """sRGB (0..1) -> CIELAB (D65)."""
    c = np.asarray(rgb, float)
    lin = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_palette_keeps_the_ablation_groups_apart():
    """The groups of the ablation + n-sweep figure: any two colours >= 15 apart (CIE76 Delta E), two
    estimators >= 25 (mean_n's darkest orange was mis's brown, its n=4 and n=8 12.9 apart)."""
    groups = [("rollout", "rollout", ""), ("recompute", "recompute", ""), ("tis(C=2,token)", "tis", "token"),
              ("mis(C=2,sequence)", "mis", "sequence"), ("icepop", "icepop", ""), ("r3", "r3", ""),
              *[(f"mean_n(n={n})", "mean_n", "") for n in (1, 2, 4, 8, 16)], ("rais", "rais", ""),
              ("gmpo_rs(gmin=0.8,eps=0.4)", "gmpo_rs", ""), ("mean_n_tis(n=8,C=2,sequence)", "mean_n_tis", "sequence"),
              ("deterministic", "deterministic", "")]
    p = Palette(groups)
    for (a, ea, _), (b, eb, _) in itertools.combinations(groups, 2):
        d = float(np.linalg.norm(_lab(p[a].colour) - _lab(p[b].colour)))
        assert d >= (15 if ea == eb else 25), (a, b, d)


@pytest.mark.parametrize("rgb", [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0)])
def test_lab_reference_points(rgb):
    assert _lab(rgb)[0] == pytest.approx(100.0 if rgb[0] else 0.0, abs=0.1)
