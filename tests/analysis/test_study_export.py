"""``make study`` exports each v3 experiment's histories with a chosen metric list (``V3_METRICS``, Makefile): the
file must hold every history the report's measures and verdicts read (reward, and ``policy/loss``: a non-finite loss
is a collapse, analysis/measures.py), every history ``--from`` asks of a file (``default_metrics``: without
``moe/replay_coverage`` a report from the file stops with an error), the along-training table's metrics, and nothing
that is not a metric."""
import re
from pathlib import Path

from analysis.along import ALONG
from analysis.config import AnalysisConfig
from analysis.load import default_metrics
from harness import metrics as M

ROOT = Path(__file__).resolve().parents[2]


def v3_metrics() -> list[str]:
    m = re.search(r"^V3_METRICS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "Makefile: no V3_METRICS"
    return m.group(1).strip().split(",")


def test_the_study_export_holds_what_the_report_reads():
    cfg = AnalysisConfig()
    chosen = set(v3_metrics())
    needed = {cfg.reward_metric, cfg.loss_metric, cfg.kl_metric, cfg.time_metric, *default_metrics(), *ALONG}
    assert needed <= chosen, sorted(needed - chosen)
    assert chosen <= set(M.CATALOGUE), sorted(chosen - set(M.CATALOGUE))


def test_stage_a_parts_hold_what_the_map_and_the_report_read():
    """scripts/run_study_v4.sh archives stage A's runs with its own metric list (the Makefile's V4_METRICS): the
    hazard map (reward, loss, the achieved dose), the along-training table and `report --from` must find theirs."""
    import subprocess

    from analysis.hazard import ACHIEVED_METRIC

    out = subprocess.run(["bash", str(ROOT / "scripts" / "run_study_v4.sh"), "--metrics"], capture_output=True,
                         text=True, check=True).stdout
    chosen = set(out.strip().split(","))
    cfg = AnalysisConfig()
    needed = {cfg.reward_metric, cfg.loss_metric, cfg.kl_metric, cfg.time_metric, ACHIEVED_METRIC, *default_metrics(),
              *ALONG}
    assert needed <= chosen, sorted(needed - chosen)
    assert chosen <= set(M.CATALOGUE), sorted(chosen - set(M.CATALOGUE))
