"""Rollout speed of the local InferenceEngine vs transformers' ``generate``, and the step-time cost
of ``mean_n`` (n=8) vs ``recompute`` - all measured side by side in one process.

    python benchmarks/rollout_speed.py            # ~1-2 minutes on a 2-core CPU machine
    python benchmarks/rollout_speed.py --quick    # fewer repetitions, a smoke test

1. Rollout tokens/s. The same tiny MoE weights (the cached warm start of the default ``moe_tiny``
   / ``sort`` spec) are loaded into our InferenceEngine and, through ``harness.backends.local.hf``,
   into a ``transformers.Qwen3MoeForCausalLM``. Every engine gets the same batch (``--batch``
   prompts of the sort task) and generates the same number of new tokens per prompt (the task's
   answer length, and a longer decode of ``--long`` tokens). Engines: ours in bf16 (the default),
   float32, float32 + deterministic; HF ``generate(do_sample=True, use_cache=True)`` in float32 and
   bf16. Repetitions are interleaved (the engine order rotates every repetition) and the median
   wall time of one ``generate`` call (prefill included) gives tokens/s = batch * new tokens / s.
2. Step time. Short ``harness.run.execute`` runs (``--steps``) of ``estimator=recompute`` and
   ``estimator=mean_n estimator.n=8``, alternated ``--step-reps`` times, into a temporary sqlite
   MLflow store; the per-step ``time/step_s`` and ``time/old_logprob_s`` are read back from the
   MLflow metric histories (first step of each run dropped as warm-up) and their medians compared.

3. Seed packs. ``PackTrainer`` steps of one seed alone (a pack of one) and of a pack of ``--pack``
   seeds, interleaved, each followed by its MLflow ``log_batch`` per seed: seconds per step, the
   pack's throughput over separate runs (S x alone / pack), seconds per ``--run-steps`` run
   (extrapolated from the measured steps), and the wall time of the 9-estimator x ``--seeds``
   ablation on ``--workers`` cores, as separate runs and in packs.

One torch thread per process (``torch.set_num_threads(1)``): with two threads on a 2-core machine
timings swing 20-40x. Needs transformers (``pip install -e .[test]``) for part 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(ROOT))

from harness.spec import load  # noqa: E402
from harness.estimators import NAMES  # noqa: E402

HF_BASE = "HF generate float32"
OURS_BASE = "local bf16 (default)"


# ------------------------------------------------------------------------------------ rollout
def _engines(cfg, policy) -> dict[str, Callable[[torch.Tensor, int], torch.Tensor]]:
    from harness.backends.local.inference_engine import InferenceEngine

    engines: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {}
    for label, kw in ((OURS_BASE, {}), ("local float32", {"dtype": "float32"}),
                      ("local float32 deterministic", {"dtype": "float32", "deterministic": True})):
        eng = InferenceEngine(policy, dataclasses.replace(cfg.inference, **kw), cfg.seed)
        engines[label] = lambda p, n, eng=eng: eng.generate(p, n).tokens
    try:
        import transformers

        from harness.backends.local import hf
    except ImportError as exc:
        print(f"# transformers not importable ({exc}): HF rows skipped")
        return engines
    transformers.logging.set_verbosity_error()
    for label, dtype in ((HF_BASE, torch.float32), ("HF generate bf16", torch.bfloat16)):
        model = hf.to_hf(policy).to(dtype)

        def gen(p: torch.Tensor, n: int, model=model) -> torch.Tensor:
            with torch.inference_mode():
                return model.generate(p, attention_mask=torch.ones_like(p), do_sample=True, temperature=1.0,
                                      top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n, use_cache=True,
                                      pad_token_id=model.config.pad_token_id)
        engines[label] = gen
    return engines


def bench_rollout(engines: dict, prompts: torch.Tensor, new_tokens: int, reps: int) -> dict[str, dict]:
    names, times = list(engines), {k: [] for k in engines}
    failed: dict[str, str] = {}
    expected = (prompts.shape[0], prompts.shape[1] + new_tokens)
    for name in names:  # warm-up, and check that every engine makes the same amount of tokens
        try:
            for _ in range(2):
                out = engines[name](prompts, new_tokens)
            if tuple(out.shape) != expected:
                raise RuntimeError(f"output shape {tuple(out.shape)} != {expected}")
        except Exception as exc:  # e.g. a dtype the HF path does not support on this machine
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    live = [n for n in names if n not in failed]
    for rep in range(reps):
        for i in range(len(live)):
            name = live[(rep + i) % len(live)]  # rotate the order: no engine always runs first
            t0 = time.perf_counter()
            engines[name](prompts, new_tokens)
            times[name].append(time.perf_counter() - t0)
    tokens = prompts.shape[0] * new_tokens
    res = {}
    for name in names:
        if name in failed:
            res[name] = {"error": failed[name]}
            continue
        q = statistics.quantiles(times[name], n=4) if len(times[name]) > 1 else [times[name][0]] * 3
        res[name] = {"median_s": statistics.median(times[name]), "tokens_per_s": tokens / statistics.median(times[name]),
                     "tokens_per_s_p25": tokens / q[2], "tokens_per_s_p75": tokens / q[0]}
    return res


def print_rollout(res: dict, title: str) -> dict[str, float]:
    print(f"\n{title}")
    print(f"  {'engine':30s} {'median s':>9s} {'tokens/s':>10s}   {'IQR tokens/s':>17s}")
    for name, r in res.items():
        if "error" in r:
            print(f"  {name:30s} {'-':>9s} {'-':>10s}   failed: {r['error']}")
        else:
            print(f"  {name:30s} {r['median_s']:9.4f} {r['tokens_per_s']:10.0f}   "
                  f"{r['tokens_per_s_p25']:8.0f}-{r['tokens_per_s_p75']:<8.0f}")
    ratios = {}
    tps = {k: v["tokens_per_s"] for k, v in res.items() if "tokens_per_s" in v}
    pairs = [(OURS_BASE, HF_BASE), (OURS_BASE, "HF generate bf16"), ("local float32", HF_BASE),
             ("local float32 deterministic", HF_BASE)]
    for a, b in pairs:
        if a in tps and b in tps:
            ratios[f"{a} / {b}"] = tps[a] / tps[b]
            print(f"  ratio tokens/s  {a} / {b} = {tps[a] / tps[b]:.2f}x")
    return ratios


# ---------------------------------------------------------------------------------- step time
def bench_steps(steps: int, reps: int, workdir: Path) -> dict:
    from mlflow.tracking import MlflowClient

    from harness.run import execute

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # after the import: mlflow sets up its logger
    uri = f"sqlite:///{workdir / 'b.db'}"
    specs = {"recompute": ["estimator=recompute"], "mean_n(n=8)": ["estimator=mean_n", "estimator.n=8"]}
    slug = {"recompute": "recompute", "mean_n(n=8)": "mean_n8"}
    per: dict[str, dict[str, list[float]]] = {k: {"time/step_s": [], "time/old_logprob_s": []} for k in specs}
    client = MlflowClient(uri)
    for rep in range(reps):  # alternate the two estimators
        for name, ov in specs.items():
            cfg = load(ov + [f"trainer.steps={steps}", f"tracking.uri={uri}", "tracking.experiment=benchmark",
                             f"out_dir={workdir / f'{slug[name]}-{rep}'}", "backend.threads=1"])
            summary = execute(cfg, progress=False, rerun=True)
            for key in per[name]:
                hist = sorted(client.get_metric_history(summary.run_id, key), key=lambda m: m.step)
                per[name][key] += [m.value for m in hist[1:]]  # drop the first step (warm-up)
    out = {name: {k: statistics.median(v) for k, v in d.items()} for name, d in per.items()}
    out["ratio"] = {k: out["mean_n(n=8)"][k] / out["recompute"][k] for k in ("time/step_s", "time/old_logprob_s")}
    return out


def print_steps(res: dict, steps: int, reps: int) -> None:
    print(f"\nstep time: harness.run.execute, default spec (moe_tiny, sort, 16 prompts x 8), {steps} steps x {reps} "
          f"runs per estimator, alternated; medians over steps (first step of each run dropped)")
    print(f"  {'estimator':14s} {'time/step_s':>12s} {'time/old_logprob_s':>19s}")
    for name in ("recompute", "mean_n(n=8)"):
        r = res[name]
        print(f"  {name:14s} {r['time/step_s']:12.4f} {r['time/old_logprob_s']:19.4f}")
    print(f"  ratio mean_n(n=8) / recompute: step {res['ratio']['time/step_s']:.2f}x, "
          f"old_logprob {res['ratio']['time/old_logprob_s']:.2f}x")


# ----------------------------------------------------------------------------------- seed packs
PACK_SPECS = {"recompute": ["estimator=recompute"], "mean_n(n=8)": ["estimator=mean_n", "estimator.n=8"]}
ABLATION = NAMES  # every registered estimator (sweeps/ablation20.yaml runs them all)


def bench_packs(size: int, steps: int, workdir: Path) -> dict:
    """Seconds per training step of one seed alone (a pack of one) and of a pack of ``size`` seeds,
    interleaved, with their MLflow logging into a sqlite store as both loops do it: per seed, whole steps
    batched (``harness.tracking.StepBuffer``), the flushes at the end spread over the measured steps
    (conservative: a run flushes before every checkpoint, every 10 steps)."""
    from harness.backends.local.trainer import PackTrainer
    from harness.tracking import StepBuffer, Tracker

    out: dict = {}
    for name, ov in PACK_SPECS.items():
        cfgs = [load(ov + [f"seed={s}"]) for s in range(size)]
        alone, pack = PackTrainer(cfgs[:1], torch.device("cpu")), PackTrainer(cfgs, torch.device("cpu"))
        trackers = [Tracker(f"sqlite:///{workdir / 'packs.db'}", "benchmark_packs") for _ in range(size)]
        alone_tracker = Tracker(f"sqlite:///{workdir / 'packs.db'}", "benchmark_packs")
        buffers = {"alone": [StepBuffer(alone_tracker)], "pack": [StepBuffer(t) for t in trackers]}
        times: dict[str, list[float]] = {"alone": [], "pack": []}
        for rep in range(steps + 1):  # the first step of each is a warm-up
            for label, trainer in (("alone", alone), ("pack", pack))[:: 1 if rep % 2 else -1]:
                t0 = time.perf_counter()
                values = trainer.step_seeds()
                for buf, v in zip(buffers[label], values):
                    buf.add(trainer.step, v)
                if rep:
                    times[label].append(time.perf_counter() - t0)
        flush = {}
        for label, bufs in buffers.items():
            t0 = time.perf_counter()
            for buf in bufs:
                buf.flush()
            flush[label] = (time.perf_counter() - t0) / (steps + 1)
        a = statistics.median(times["alone"]) + flush["alone"]
        p = statistics.median(times["pack"]) + flush["pack"]
        out[name] = {"alone_s_per_step": a, "pack_s_per_step": p, "throughput_ratio": size * a / p}
    return out


def print_packs(res: dict, size: int, steps: int, run_steps: int, seeds: int, workers: int) -> dict:
    print(f"\nseed packs: PackTrainer, default spec, one seed alone vs a pack of {size} seeds, {steps} interleaved "
          f"steps each (after one warm-up), MLflow logging included; medians")
    print(f"  {'estimator':14s} {'alone s/step':>13s} {'pack s/step':>12s} {'throughput':>11s} "
          f"{run_steps}-step run: {'alone':>7s} {'in pack':>8s}")
    for name, r in res.items():
        print(f"  {name:14s} {r['alone_s_per_step']:13.3f} {r['pack_s_per_step']:12.3f} {r['throughput_ratio']:10.2f}x "
              f"{'':15s}{run_steps * r['alone_s_per_step']:6.0f} s {run_steps * r['pack_s_per_step'] / size:7.0f} s")
    print(f"  ({run_steps}-step times extrapolated from the measured {steps} steps; 'in pack' = the pack's wall "
          f"time per seed)")
    # the ablation: every estimator but mean_n costs about a recompute step (one training-engine forward)
    cost = {e: res["mean_n(n=8)" if e == "mean_n" else "recompute"] for e in ABLATION}
    cpu_alone = sum(seeds * run_steps * c["alone_s_per_step"] for c in cost.values())
    cpu_pack = sum(seeds * run_steps * c["pack_s_per_step"] / size for c in cost.values())
    est = {"runs": len(ABLATION) * seeds, "alone_min": cpu_alone / workers / 60, "packed_min": cpu_pack / workers / 60}
    print(f"  ablation estimate: {len(ABLATION)} estimators x {seeds} seeds = {est['runs']} runs x {run_steps} steps on "
          f"{workers} workers: {est['alone_min']:.0f} min as separate runs, {est['packed_min']:.0f} min in packs of "
          f"{size} (mean_n's measured cost for mean_n, recompute's for the other {len(ABLATION) - 1}; warm starts not "
          "included)")
    return est


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128, help="prompts per generate call (default 128)")
    ap.add_argument("--reps", type=int, default=25, help="interleaved repetitions per engine (default 25)")
    ap.add_argument("--long", type=int, default=64, help="new tokens of the long-decode case (0 = skip; default 64)")
    ap.add_argument("--steps", type=int, default=10, help="trainer.steps of each step-time run (default 10)")
    ap.add_argument("--step-reps", type=int, default=2, help="runs per estimator for the step time (default 2)")
    ap.add_argument("--pack", type=int, default=8, help="seeds in the pack (default 8; 0 = skip the pack part)")
    ap.add_argument("--pack-steps", type=int, default=6, help="measured steps alone and in the pack (default 6)")
    ap.add_argument("--run-steps", type=int, default=300, help="steps of the extrapolated run (default 300)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds per estimator of the ablation estimate (default 20)")
    ap.add_argument("--workers", type=int, default=2, help="parallel workers (cores) of the estimate (default 2)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 5 reps, 4 steps, 1 run each, 2 pack steps")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--workdir", type=Path, help="keep the MLflow store and run dirs here (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.step_reps, args.pack_steps = 5, 4, 1, 2
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    t_start = time.perf_counter()

    from harness.backends.local.tasks import Task
    from harness.backends.local.warmstart import warm_start

    cfg = load([])
    policy, _ = warm_start(cfg.model, cfg.task, cfg.seed)
    task = Task(cfg.task)
    prompts, _ = task.sample(args.batch, torch.Generator().manual_seed(1234))
    torch.manual_seed(0)
    engines = _engines(cfg, policy)
    results: dict = {"batch": args.batch, "prompt_len": task.prompt_len, "reps": args.reps,
                     "torch": torch.__version__, "threads": torch.get_num_threads(), "rollout": {}}
    print(f"model {cfg.model.name} ({cfg.model.kind}: d={cfg.model.d_model}, L={cfg.model.n_layers}, "
          f"E={cfg.model.n_experts}, k={cfg.model.top_k}), warm-started weights; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread")
    for new in [task.answer_len] + ([args.long] if args.long else []):
        res = bench_rollout(engines, prompts, new, args.reps)
        title = (f"rollout: {args.batch} sort prompts of {task.prompt_len} tokens, {new} new tokens each "
                 f"({'the task answer length' if new == task.answer_len else 'long decode'}), "
                 f"median of {args.reps} interleaved reps, prefill included")
        results["rollout"][str(new)] = {"engines": res, "ratios": print_rollout(res, title)}

    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results["steps"] = bench_steps(args.steps, args.step_reps, workdir)
        print_steps(results["steps"], args.steps, args.step_reps)
        if args.pack:
            results["packs"] = bench_packs(args.pack, args.pack_steps, workdir)
            results["ablation"] = print_packs(results["packs"], args.pack, args.pack_steps, args.run_steps,
                                              args.seeds, args.workers)
    results["wall_s"] = time.perf_counter() - t_start
    print(f"\ntotal {results['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
