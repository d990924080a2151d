"""tests/golden/curves.json: 3 steps of each estimator (tiny budgets), every logged metric as float.hex.
Written before the architecture redesign; tests/test_golden.py holds the code to it bitwise."""
import json, sys
from harness import numerics
numerics.pin()  # the runs' pinned CPU numerics, before torch's first operator
import torch
torch.set_num_threads(1)  # as every run (backend.threads: 1); MKL's results depend on its thread count
from harness.spec import load
from harness.backends.local.trainer import LocalTrainer
from harness.estimators import NAMES
ARGS = ["trainer.steps=3", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
        "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_passes=2", "diagnostics.noise_sequences=4"]
EXTRA = {"mean_n": ["estimator.n=3"], "mean_n_tis": ["estimator.n=3"]}
#: arms beyond each estimator's default spec: name -> overrides
ARMS = {"deterministic(frozen)": ["estimator=deterministic", "estimator.noise=frozen"]}
out = {}
for name, overrides in [*((n, [f"estimator={n}", *EXTRA.get(n, [])]) for n in NAMES), *ARMS.items()]:
    cfg = load([*overrides, *ARGS])
    torch.manual_seed(0)
    tr = LocalTrainer(cfg, torch.device("cpu"))
    steps = [tr.run_step() for _ in range(cfg.trainer.steps)]
    out[name] = {"signature": cfg.signature, "steps": [{k: float(v).hex() for k, v in sorted(s.items()) if not k.startswith("time/") and k != "tokens/per_s"} for s in steps]}
    print(name, steps[-1].get("reward/mean"), file=sys.stderr)
out["_fingerprint"] = numerics.fingerprint()  # what these bits were computed with (tests/test_golden.py)
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
