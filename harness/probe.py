"""``python -m harness.probe [key=value ...]``: the noise probe for a model and its dense twin.

Prints diff / var_rollout / var_train per token for the configured MoE (``model=...``) and its
dense twin (``twin=dense_tiny``) beside the KwaiKAT numbers, and logs each as an MLflow run tagged
``probe=1`` with metrics ``probe/diff``, ``probe/var_rollout``, ``probe/var_train`` (and ``probe_of`` = the
probed spec's signature in place of ``spec_sig``/``group_sig``: a probe is not a finished run of that spec).
Extra options: ``--passes N`` (default 8), ``--sequences N`` (default 256).
"""
from __future__ import annotations

import sys

from harness.spec import ConfigError, load


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}" if x < 1e-2 else f"{x:.4f}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    opts = {"--passes": 8, "--sequences": 256}
    rest = []
    it = iter(argv)
    for a in it:
        if a in opts:
            opts[a] = int(next(it))
        else:
            rest.append(a)
    twin = "dense_tiny"
    overrides = []
    for a in rest:
        if a.startswith("twin="):
            twin = a.split("=", 1)[1]
        else:
            overrides.append(a)
    try:
        cfgs = [load(overrides), load([*overrides, f"model={twin}"])]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import torch

    from harness import metrics as M
    from harness.backends.local.probe import probe
    from harness.tags import perturbation, run_tags
    from harness.tracking import Tracker

    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(cfgs[0].backend.threads)
    rows = []
    for cfg in cfgs:
        res = probe(cfg, n=opts["--passes"], sequences=opts["--sequences"])
        # the run tags less the identity ones: a probe measured the spec's engines, it did not train the spec, so
        # it must not be found as the spec's FINISHED run (harness.store) nor read as its progress (status)
        tags = {**{k: v for k, v in run_tags(cfg).items() if k not in ("spec_sig", "group_sig")},
                "probe": "1", "probe_of": cfg.signature, "model_kind": res.kind}
        tracker = Tracker(cfg.tracking_uri, cfg.tracking.experiment, run_name=f"probe-{cfg.model.name}", tags=tags)
        tracker.log_params({"probe.passes": opts["--passes"], "probe.sequences": opts["--sequences"],
                            **{f"inference.{k}": v for k, v in cfg.inference.__dict__.items()}})
        tracker.log_step(0, {M.PROBE_DIFF: res.diff, M.PROBE_VAR_ROLLOUT: res.var_rollout,
                             M.PROBE_VAR_TRAIN: res.var_train})
        tracker.finish()
        rows.append(res)
    print(f"noise probe ({opts['--passes']} passes, {rows[0].tokens} response tokens, inference "
          f"{cfgs[0].inference.dtype}, perturbations: {perturbation(cfgs[0])})")
    print("| model | kind | diff | var_rollout | var_train | KwaiKAT diff / var_rollout / var_train |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        k = M.KWAIKAT_PROBE[r.kind]
        print(f"| {r.model} | {r.kind} | {_fmt(r.diff)} | {_fmt(r.var_rollout)} | {_fmt(r.var_train)} | "
              f"{' / '.join(_fmt(k[m]) for m in M.PROBE_METRICS)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
