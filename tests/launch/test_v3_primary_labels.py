"""Issue 31's confirmatory sweeps declare their primary contrasts as group labels (``primary:``). A label that no
group of the experiment carries is not tested (analysis/report.py ``primary_note``: "no group ... that contrast is not
tested"), so the declared labels must be exactly those analysis gives these runs: their tags and logged params
(``harness.tags.run_tags``, the flat spec as ``harness.backends.local.run.start`` logs it) through
``analysis.load`` (base label, identity labels) and the ordered families (``analysis.verdict_tables``). Checked with
the exploratory sweeps that share each experiment, and with the confirmatory runs alone."""
import pytest

from analysis.load import RunRecord, _runs_frame
from analysis.verdict_tables import ordered_families
from harness.launch.expand import validate
from harness.launch.spec import load_spec
from harness.summary import flat
from harness.tags import run_tags
from harness.uri import ROOT


def records(*sweeps: str) -> list[RunRecord]:
    out = []
    for sweep in sweeps:
        # two seeds: a label does not depend on the seed (the group signature leaves it out)
        for i, run in enumerate(validate(load_spec(ROOT / "sweeps" / f"{sweep}.yaml", ["seeds=[100,101]"]))):
            params = {**flat(run.cfg.public_dict()), "warmstart.steps": 0, "warmstart.reward": 0.0}
            out.append(RunRecord(run_id=f"{sweep}-{i}", run_name=None, status="FINISHED", start_time=i,
                                 tags=run_tags(run.cfg, commit="x"), params={k: str(v) for k, v in params.items()}))
    return out


class _Exp:
    def __init__(self, runs):
        self.runs = runs


@pytest.mark.parametrize("sweeps", [("v3_sparse",), ("v3_sparse", "v3_explore_sparse"),
                                    ("v3_bias",), ("v3_bias", "v3_explore_bias")])
def test_every_declared_primary_contrast_names_groups_the_report_will_have(sweeps):
    spec = load_spec(ROOT / "sweeps" / f"{sweeps[0]}.yaml", [])
    assert spec.primary
    runs = _runs_frame(records(*sweeps), ())
    labels, families = set(runs["label"]), ordered_families(_Exp(runs))
    for contrast in spec.primary:
        if contrast[0] == "trend":
            assert contrast[1] in families, (contrast, sorted(families))
        else:
            assert set(contrast) <= labels, (contrast, sorted(labels))
    primary_arms = {x for c in spec.primary if c[0] != "trend" for x in c}
    confirmatory = set(_runs_frame(records(sweeps[0]), ())["label"])
    assert primary_arms <= confirmatory  # an exploratory arm never takes a primary label
