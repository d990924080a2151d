"""The noise probe (KwaiKAT's table): how noisy each engine's log-probs are, MoE vs dense twin.

On a fixed batch sampled by the inference engine, per response token (per token the policy sampled, for a
multi-turn task):

    diff        = mean_i |logp_train - logp_inf[i]|
    var_rollout = Var_i(logp_inf[i])      (n fresh inference scorings)
    var_train   = Var_i(logp_train[i])    (n training-engine forwards)
    diff_p99, diff_p999 = the 99th / 99.9th percentiles of |logp_train - logp_inf[i]| over (pass, token): the tail
    flip_rate   = the share of response tokens the rollout routed to another top-k set than the training engine
                  does, in some layer (MoE; ``moe/routing_flip_rate``'s definition)

averaged over tokens (leaving out a token that a pass scores -inf: outside its nucleus, processed mode with
top-k / top-p). KwaiKAT (Qwen3, vLLM vs Megatron): dense 0.002 / 1e-5 / 0 and MoE
0.008 / 1e-3 / 1e-7.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.backends.local.warmstart import warm_start
from harness.spec import RunConfig

@dataclass
class ProbeResult:
    model: str
    kind: str
    diff: float
    var_rollout: float
    var_train: float
    tokens: int
    diff_p99: float = float("nan")  # quantiles of |logp_train - logp_inf[i]| over (pass, token): the tail
    diff_p999: float = float("nan")
    flip_rate: float = float("nan")  # share of tokens routed to another top-k set (any layer), rollout vs train


@torch.no_grad()
def probe(cfg: RunConfig, n: int = 8, sequences: int = 256) -> ProbeResult:
    """The probe on the spec's warm-started policy (what ``python -m harness.probe`` reports)."""
    policy, _ = warm_start(cfg.model, cfg.task, cfg.seed)
    return probe_policy(policy, cfg, n, sequences)


@torch.no_grad()
def probe_policy(policy, cfg: RunConfig, n: int = 8, sequences: int = 256, scale: float | None = None,
                 prompt_seed: int | None = None, draws: int = 0) -> ProbeResult:
    """The probe on ``policy`` (a ``Policy``, e.g. a run's weights at some step) with the spec's engines; ``scale``:
    the KL-held perturbation's scale c_t that step ran at (kl_control.py; None = the configured level); ``draws``: the
    engine's step word for its keyed random numbers (philox.py), so probes at several steps draw fresh noise."""
    task = Task(cfg.task)
    seed = cfg.seed + 99 if prompt_seed is None else prompt_seed
    prompts, _ = task.sample(sequences, torch.Generator().manual_seed(seed))
    device = torch.device("cuda" if cfg.backend.device != "cpu" and torch.cuda.is_available() else "cpu")
    policy = policy.to(device)
    infer = InferenceEngine(policy, cfg.inference, cfg.seed, device)
    infer.begin_step(draws)
    if scale is not None:
        infer.scale = torch.tensor([scale], dtype=torch.float32, device=device)
    roll = task.rollout(infer, prompts.to(device))
    tokens = roll.tokens
    train = TrainEngine(policy, cfg.inference.temperature)
    inf = infer.score(tokens, task.prompt_len, n)  # [n, B, R]
    trn = torch.stack([train.logprobs(tokens, task.prompt_len).logp for _ in range(n)])
    # over the policy's tokens: a multi-turn rollout's observation and padding are not sampled; and over the tokens
    # every pass scores finitely (processed top-k / top-p: a pass can put the sampled token outside its nucleus)
    keep = torch.isfinite(inf).all(0)
    if roll.mask is not None:
        keep = keep & (roll.mask > 0)
    plain = roll.mask is None and bool(keep.all())
    policy_tokens = (lambda x: x) if plain else (lambda x: x[..., keep])  # noqa: E731
    flip = float("nan")
    if roll.routed_experts is not None:  # a MoE: the rollout's routes against the training engine's
        from harness.backends.local.trainer import routing_flip_rate
        sel = train.logprobs(tokens, task.prompt_len).selected
        routes = roll.routed_experts[:, task.prompt_len - 1:-1]  # the predicting positions
        flip = routing_flip_rate(routes[None], sel[None], None if roll.mask is None else roll.mask[None]).item()
    dev = policy_tokens((trn[0] - inf).abs())
    tail = torch.quantile(dev.flatten().double().cpu(), torch.tensor([0.99, 0.999], dtype=torch.float64))
    return ProbeResult(
        model=cfg.model.name, kind=cfg.model.kind,
        diff=dev.mean().item(), diff_p99=float(tail[0]), diff_p999=float(tail[1]), flip_rate=flip,
        var_rollout=policy_tokens(inf.var(0, unbiased=False)).mean().item(),
        var_train=policy_tokens(trn.var(0, unbiased=False)).mean().item(),
        tokens=policy_tokens(tokens[:, task.prompt_len:]).numel(),
    )
