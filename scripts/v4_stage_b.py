"""Science v4, stage B's sweep file from stage A's outcome (docs/preregistration_v4.md, "Stage B").

The pre-registration fixes stage B's arms, contrasts, horizon and seed rule before stage A's outcome is known; the
two numbers stage A supplies are mechanical: the cell (dose d*, lr*) from stage A's selection rule
(``python -m analysis hazard``: rule.md) and the seed count N from the power rule. This script writes the sweep file
they determine, with the declared pairs (B1-B5) as its ``primary`` list in the labels the analysis gives those groups
(computed here by the analysis's own grouping from the runs' real tags and params), and the analysis command (B6,
the dose x estimator interaction, included) in its header. Commit the file before stage B's first run.

    python scripts/v4_stage_b.py --dose 0.003 --lr 6e-4 --seeds 64 --out sweeps/v4_stage_b.yaml
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIGMA, RATE_PER_DOSE, HORIZON, TAIL, FIRST_SEED = 4.0, 0.02 / 1e-3, 1500, 150, 400


def rate(dose: float) -> float:
    """The share of router rows the noise hits at a dose (stage A's rule: 0.02 x dose / 1e-3, at most 1)."""
    return min(1.0, round(RATE_PER_DOSE * dose, 6))


def noise(dose: float) -> dict:
    if dose == 0:
        return {"inference.router_noise_sigma": 0.0}
    return {"inference.router_noise_sigma": SIGMA, "inference.router_noise_rate": rate(dose),
            "inference.kl_target": dose}


def arms(dose: float) -> list[tuple[str, dict]]:
    """(name, variant) of the 10 arms, in the pre-registration's order."""
    mean8 = {"estimator": "mean_n", "estimator.n": 8}
    at = lambda d, est: {**est, **noise(d)}  # noqa: E731
    return [("recompute", at(dose, {"estimator": "recompute"})), ("rollout", at(dose, {"estimator": "rollout"})),
            ("tis", at(dose, {"estimator": "tis"})), ("r3", at(dose, {"estimator": "r3"})),
            ("mean_8", at(dose, mean8)), ("control", at(0.0, {"estimator": "recompute"})),
            ("recompute_half", at(dose / 2, {"estimator": "recompute"})),
            ("recompute_double", at(2 * dose, {"estimator": "recompute"})),
            ("mean_8_half", at(dose / 2, mean8)), ("mean_8_double", at(2 * dose, mean8))]


#: B1-B5 as pairs of arm names (B6, the interaction of recompute and mean_8 over the three doses, is the header's
#: ``--interaction``)
PAIRS = [("recompute", "mean_8"), ("rollout", "mean_8"), ("tis", "mean_8"), ("r3", "recompute"),
         ("recompute", "control")]


def _yaml_value(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def sweep_text(dose: float, lr: float, seeds: int, labels: dict[str, str] | None = None) -> str:
    variants = "\n".join("  - {" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in var.items()) + "}"
                         for _, var in arms(dose))
    seed_list = ", ".join(str(FIRST_SEED + i) for i in range(seeds))
    primary = "" if labels is None else "primary:\n" + "\n".join(
        f'  - ["{labels[a]}", "{labels[b]}"]' for a, b in PAIRS) + "\n"
    pairs = " ".join(f'--pair "{labels[a]}|{labels[b]}"' for a, b in PAIRS) if labels else "--pair ..."
    return f"""# Science v4, STAGE B (confirmatory; docs/preregistration_v4.md, "Stage B"), written by scripts/v4_stage_b.py from
# stage A's cell (dose {dose:g}, lr {lr:g}: the selection rule's output) and the power rule's seed count ({seeds}).
# Commit this file before any run of experiment v4_stage_b starts; a change after that is a deviation to report.
# Arms: recompute, rollout, TIS (C 2), R3 and mean_8 at the dose; recompute on the natural engine (the no-noise
# control); recompute and mean_8 at half and twice the dose. Horizon {HORIZON} scored steps + {TAIL} unscored.
#   python -m harness.sweep sweeps/v4_stage_b.yaml launcher=local --wait      # or benchmarks/gpu_study.sh on a GPU
#   python -m analysis survival --from docs/results/v4_stage_b/parts --horizon {HORIZON} {pairs} --interaction "recompute|mean_n(n=8)" --out docs/results/v4_stage_b
name: v4_stage_b
description: "stage B: 10 arms x {seeds} paired seeds at dose {dose:g} (and half, twice), lr {lr:g}, clip 1.0, {HORIZON}+{TAIL} steps"
experiment: v4_stage_b
base:
  - trainer.steps={HORIZON + TAIL}
  - trainer.max_grad_norm=1.0
  - trainer.lr={lr!r}
grid: {{}}
variants:
{variants}
seeds: [{seed_list}]
{primary}launcher:
  name: local
  time_min: 900
  cpus_per_task: 1
  mem_gb: 4
  array_parallelism: 2
  checkpoint_every: 25
  seeds_per_job: 8
"""


def labels_of(path: Path, dose: float) -> dict[str, str]:
    """Each arm's group label as ``python -m analysis`` will name it: the sweep's specs expanded
    (``harness.launch.expand``), one run record per arm with the tags and params a real run logs, grouped and
    labelled by ``analysis.load.assemble`` (no store, no training)."""
    from analysis.load import RunRecord, assemble
    from harness.launch.expand import validate
    from harness.launch.spec import load_spec
    from harness.summary import flat
    from harness.tags import run_tags

    spec = load_spec(path)
    planned = validate(spec)
    first = {}
    for p in planned:  # one run per arm: its first seed
        first.setdefault(p.cfg.group_signature, p.cfg)
    records = []
    for i, cfg in enumerate(first.values()):
        tags = {**run_tags(cfg, commit="x"), "seed": str(cfg.seed), "spec_sig": cfg.signature}
        records.append(RunRecord(run_id=f"r{i}", run_name=None, status="FINISHED", start_time=0, tags=tags,
                                 params={k: str(v) for k, v in flat(cfg.public_dict()).items()}))
    exp = assemble(spec.experiment, "0", "none://", records, lambda ids, ms: {m: {} for m in ms}, metrics=())
    label = dict(zip(exp.runs["run_id"], exp.runs["label"]))
    return {name: label[f"r{i}"] for i, (name, _) in enumerate(arms(dose))}  # the variants' order is arms()'s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dose", type=float, required=True, help="stage A's chosen dose d* (k3 target)")
    ap.add_argument("--lr", type=float, required=True, help="stage A's chosen learning rate lr*")
    ap.add_argument("--seeds", type=int, required=True, help="N from the power rule (64 to 256)")
    ap.add_argument("--out", default="sweeps/v4_stage_b.yaml")
    args = ap.parse_args(argv)
    if not (args.dose > 0 and args.lr > 0 and 64 <= args.seeds <= 256):
        print("error: --dose and --lr must be > 0 and --seeds within 64..256 (docs/preregistration_v4.md)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "v4_stage_b.yaml"
        draft.write_text(sweep_text(args.dose, args.lr, args.seeds))
        labels = labels_of(draft, args.dose)
    Path(args.out).write_text(sweep_text(args.dose, args.lr, args.seeds, labels))
    print(f"wrote {args.out}: 10 arms x {args.seeds} seeds; declared pairs: "
          + "; ".join(f"{labels[a]} vs {labels[b]}" for a, b in PAIRS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
