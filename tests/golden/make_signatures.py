"""Write tests/golden/signatures.json (or argv[1]): the spec signature of every run of every shipped sweep and
of each estimator's default spec. Run from the repository root."""
import json, glob, sys
from harness.launch.expand import validate
from harness.launch.spec import load_spec
from harness.spec import load
out = {}
for path in sorted(glob.glob("sweeps/*.yaml")):
    try:
        spec = load_spec(path)
        runs = validate(spec)
    except Exception as e:  # noqa
        print("skip", path, e, file=sys.stderr); continue
    for r in runs:
        out[f"{path}|{' '.join(r.overrides)}"] = r.cfg.signature
for name in ["rollout","recompute","tis","mis","icepop","r3","mean_n","rais","deterministic","mean_n_tis","gmpo_rs","geo_rs","r2"]:
    cfg = load([f"estimator={name}"])
    out[f"default|estimator={name}"] = cfg.signature
out["default|estimator=deterministic estimator.noise=frozen"] = load(["estimator=deterministic", "estimator.noise=frozen"]).signature
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/signatures.json", "w"), indent=0, sort_keys=True)
print(len(out))
