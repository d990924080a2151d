"""Match a biased perturbation to unbiased noise by KL (issue 6, noise vs bias).

    python scripts/equal_kl.py [--sigmas 0.5,1.0] [--deltas 0.9,0.7,0.5,0.3,0.2,0.1]

On the warm-started default policy and a fixed batch, prints the mean per-position
KL(p_inference || p_train) of the inference engine with (a) output-logit noise of scale sigma
(fresh per call: unbiased in logit space) and (b) the bias knob (probabilities of tokens below
``bias_threshold`` scaled by delta), both on the natural engine (router noise 0; any override,
e.g. ``inference.router_noise_sigma=1.0``, changes the engine they start from). Pick the delta
whose KL equals a sigma's: that pair is the noise-vs-bias contrast of equal KL.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import forward
from harness.backends.local.warmstart import warm_start
from harness.spec import load


@torch.no_grad()
def mean_kl(cfg, policy, tokens, prompt_len: int, passes: int = 4) -> float:
    eng = InferenceEngine(policy, cfg.inference, cfg.seed)
    train = torch.log_softmax(forward(policy, tokens).logits[:, prompt_len - 1:-1], -1)
    kls = []
    for _ in range(passes):
        logits, _, _ = eng._forward(eng._call(), tokens, 0, None)  # a fresh engine call: its own keyed draws
        inf = eng._model_logp(logits[:, prompt_len - 1:-1])
        kls.append((inf.exp() * (inf - train)).sum(-1).mean().item())
    return sum(kls) / len(kls)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sigmas", default="0.25,0.5,1.0")
    ap.add_argument("--deltas", default="0.9,0.7,0.5,0.3,0.2,0.1,0.05")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    cfg = load(["inference.router_noise_sigma=0", *args.overrides])
    policy, _ = warm_start(cfg.model, cfg.task, cfg.seed)
    task = Task(cfg.task)
    if task.spec.tool is not None:  # its KL would be over observation and padding tokens too
        raise SystemExit(f"error: task: equal_kl.py measures single-turn tasks; {cfg.task.name!r} is multi-turn")
    prompts, _ = task.sample(256, torch.Generator().manual_seed(0))
    tokens = InferenceEngine(policy, cfg.inference, cfg.seed).generate(prompts, task.answer_len).tokens
    with_ = lambda **kw: dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, **kw))  # noqa: E731
    from harness.tags import perturbation

    print(f"engine with perturbations: {perturbation(cfg)}: KL = {mean_kl(cfg, policy, tokens, task.prompt_len):.2e}")
    for s in [float(v) for v in args.sigmas.split(",") if v]:
        print(f"logit_noise_sigma={s:<5g} KL = {mean_kl(with_(logit_noise_sigma=s), policy, tokens, task.prompt_len):.2e}")
    for d in [float(v) for v in args.deltas.split(",") if v]:
        print(f"bias_delta={d:<5g} (threshold {cfg.inference.bias_threshold}) KL = "
              f"{mean_kl(with_(bias_delta=d), policy, tokens, task.prompt_len):.2e}")


if __name__ == "__main__":
    main()
