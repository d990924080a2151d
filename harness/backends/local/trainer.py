"""One GRPO/PPO training step of the local backend, and its state for exact resume.

    rollout  : InferenceEngine.generate          -> tokens, logp_roll, routed experts
    reward   : task reward, GRPO advantages A = (r - mean_group) / (std_group + eps)
    old      : Estimator.old_policy(context)      -> OldPolicy(logp, weight, mask, replay)
    update   : ppo_epochs x num_minibatches optimiser steps on
               L = -sum_t m_t w_t min(r_t A, clip(r_t, 1-eps, 1+eps) A) / sum_t m_t
    sync     : the inference engine reloads the new weights (as verl syncs vLLM)

The trainer only calls the estimator's hooks; it never branches on an estimator's name. All
randomness comes from named generators whose states are part of ``state_dict`` (exact resume).
"""
from __future__ import annotations

import dataclasses
import math
import time

import torch
from torch import Tensor

from harness import estimators
from harness import metrics as M
from harness.backends.local.inference_engine import InferenceEngine, Rollout
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.backends.local.warmstart import warm_start
from harness.config import RunConfig
from harness.estimators.base import OldPolicy, PolicyForward


def grpo_advantages(reward: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages: (r - mean_group) / (std_group + eps), one per sequence."""
    g = reward.view(-1, group_size)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + eps)).view(-1)


def ppo_loss(ratio: Tensor, adv: Tensor, weight: Tensor, mask: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """Token-mean PPO-clipped loss over unmasked tokens, and the clipped share."""
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    pg = torch.minimum(ratio * adv, clipped * adv)
    denom = mask.sum().clamp(min=1.0)
    loss = -(weight * pg * mask).sum() / denom
    clipfrac = (((ratio - 1).abs() > clip_eps).float() * mask).sum() / denom
    return loss, clipfrac


class OldPolicyContext:
    """Lazy, cached access to what estimators may use; each quantity is computed once."""

    def __init__(self, train: TrainEngine, infer: InferenceEngine, roll: Rollout, prompt_len: int, mask: Tensor):
        self.train, self.infer, self.roll, self.prompt_len = train, infer, roll, prompt_len
        self.logp_roll = roll.logp
        self.mask = mask
        self.routed_experts = roll.routed_experts
        self._recompute: dict[bool, PolicyForward] = {}
        self._scores: Tensor | None = None

    def recompute(self, replay: Tensor | None = None) -> PolicyForward:
        key = replay is not None
        if key not in self._recompute:
            self._recompute[key] = self.train.logprobs(self.roll.tokens, self.prompt_len, replay)
        return self._recompute[key]

    def score(self, n: int) -> Tensor:
        if self._scores is None or self._scores.shape[0] != n:
            self._scores = self.infer.score(self.roll.tokens, self.prompt_len, n)
        return self._scores


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()


class LocalTrainer:
    def __init__(self, cfg: RunConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        policy, self.warmstart = warm_start(cfg.model, cfg.task, cfg.seed)
        self.policy = policy.to(device)
        self.train = TrainEngine(self.policy)
        self.estimator = estimators.build(cfg.estimator)
        icfg = cfg.inference
        if self.estimator.requires_deterministic_inference:
            icfg = dataclasses.replace(icfg, deterministic=True)
        self.infer = InferenceEngine(self.policy, icfg, cfg.seed, device)
        self.task = Task(cfg.task)
        self.data_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 3)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 4)
        self.diag_gen = torch.Generator(device).manual_seed(cfg.seed * 1000 + 5)
        tr = cfg.trainer
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=tr.lr, weight_decay=tr.weight_decay)
        self.step = 0

    # ---------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "policy": self.policy.state_dict(),
            "opt": self.opt.state_dict(),
            "data_gen": self.data_gen.get_state(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            "diag_gen": self.diag_gen.get_state(),
            "infer": self.infer.state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.data_gen.set_state(state["data_gen"])
        self.shuffle_gen.set_state(state["shuffle_gen"])
        self.diag_gen.set_state(state["diag_gen"])
        self.infer.load_state(state["infer"])
        self.infer.load_weights(self.policy)

    # ----------------------------------------------------------------------------- step
    def run_step(self) -> dict[str, float]:
        cfg, tr, dev = self.cfg, self.cfg.trainer, self.device
        t_step = time.perf_counter()
        prompts, answers = self.task.sample(tr.prompts_per_step, self.data_gen)
        prompts = prompts.repeat_interleave(tr.group_size, 0).to(dev)
        answers = answers.repeat_interleave(tr.group_size, 0).to(dev)
        pl = self.task.prompt_len

        t = time.perf_counter()
        roll = self.infer.generate(prompts, self.task.answer_len)
        t_roll = time.perf_counter() - t
        reward, exact = self.task.reward(roll.tokens[:, pl:], answers)
        adv = grpo_advantages(reward, tr.group_size)
        mask = torch.ones_like(roll.logp)

        ctx = OldPolicyContext(self.train, self.infer, roll, pl, mask)
        t = time.perf_counter()
        old = self.estimator.old_policy(ctx)
        t_old = time.perf_counter() - t

        t = time.perf_counter()
        out = self._diagnostics(ctx, old, roll, mask)
        t_diag = time.perf_counter() - t

        t = time.perf_counter()
        out.update(self._update(roll.tokens, pl, adv, old))
        t_update = time.perf_counter() - t
        self.infer.load_weights(self.policy)
        self.step += 1

        t_all = time.perf_counter() - t_step
        out.update({
            M.REWARD_MEAN: reward.mean().item(), M.REWARD_STD: reward.std().item(),
            M.REWARD_ACCURACY: exact.mean().item(),
            M.TIME_ROLLOUT: t_roll, M.TIME_OLD_LOGPROB: t_old, M.TIME_UPDATE: t_update,
            M.TIME_DIAGNOSTICS: t_diag, M.TIME_STEP: t_all,
            M.TOKENS_PER_S: roll.logp.numel() / max(t_roll, 1e-9),
        })
        return out

    def _diagnostics(self, ctx: OldPolicyContext, old: OldPolicy, roll: Rollout, mask: Tensor) -> dict[str, float]:
        out: dict[str, float] = {}
        logp_roll = roll.logp
        rec = ctx.recompute()  # plain recompute (cached when the estimator used it)
        for prefix, logp in (("", old.logp), ("rec_", rec.logp)):
            d = logp - logp_roll
            out[f"mismatch/{prefix}k1"] = _masked_mean(-d, mask)
            out[f"mismatch/{prefix}k3"] = _masked_mean(torch.expm1(d) - d, mask)
        pdiff = (rec.logp.exp() - logp_roll.exp()).abs()
        out[M.MISMATCH_PROB_DIFF_MAX] = pdiff.max().item()
        out[M.MISMATCH_PROB_DIFF_MEAN] = _masked_mean(pdiff, mask)

        # the effective IS weight of the first update, under the pre-update weights
        start = ctx.recompute(old.replay)
        w = old.weight * torch.exp((start.logp - old.logp).clamp(max=50.0))
        m = old.mask
        wm = w[m > 0]
        out[M.IS_WEIGHT_MEAN] = wm.mean().item() if wm.numel() else float("nan")
        out[M.IS_WEIGHT_MAX] = wm.max().item() if wm.numel() else float("nan")
        out[M.IS_ESS] = (wm.sum() ** 2 / (wm.numel() * (wm ** 2).sum())).item() if wm.numel() else 0.0
        out[M.IS_MASKED_FRAC] = 1.0 - ((old.mask * (old.weight != 0)).sum() / mask.sum()).item()

        if roll.routed_experts is not None and rec.selected is not None:
            pl = self.task.prompt_len
            roll_sel = roll.routed_experts[:, pl - 1:-1].sort(-1).values
            flips = (roll_sel != rec.selected.sort(-1).values).any(-1).any(-1).float()
            out[M.MOE_ROUTING_FLIP_RATE] = flips.mean().item()
            p_roll = roll.router_logp
            out[M.MOE_ROUTER_KL] = (p_roll.exp() * (p_roll - rec.router_logp)).sum(-1).mean().item()

        diag = self.cfg.diagnostics
        if diag.noise_passes >= 2:
            rows = roll.tokens[: diag.noise_sequences]
            s = self.infer.score(rows, self.task.prompt_len, diag.noise_passes, generator=self.diag_gen)
            out[M.NOISE_VAR_ROLLOUT] = s.var(0, unbiased=False).mean().item()
        return out

    def _update(self, tokens: Tensor, pl: int, adv: Tensor, old: OldPolicy) -> dict[str, float]:
        tr = self.cfg.trainer
        b = tokens.shape[0]
        mb = b // tr.num_minibatches
        params = list(self.policy.parameters())
        max_norm = tr.max_grad_norm if tr.max_grad_norm is not None else math.inf
        losses, norms, clipfracs, kls, entropies = [], [], [], [], []
        for _ in range(tr.ppo_epochs):
            perm = torch.randperm(b, generator=self.shuffle_gen).to(tokens.device)
            for i in range(tr.num_minibatches):
                idx = perm[i * mb:(i + 1) * mb]
                o = old.select(idx)
                new = self.train.forward(tokens[idx], pl, o.replay, with_entropy=True)
                ratio = self.estimator.ratio(new.logp, o, new)
                loss, clipfrac = ppo_loss(ratio, adv[idx, None], o.weight, o.mask, tr.clip_eps)
                if tr.entropy_coef:
                    loss = loss - tr.entropy_coef * _t_masked_mean(new.entropy, o.mask)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
                if torch.isfinite(loss) and torch.isfinite(norm):
                    self.opt.step()
                with torch.no_grad():
                    log_r = (new.logp - o.logp).clamp(-50, 50)
                    kls.append(_masked_mean(torch.expm1(log_r) - log_r, o.mask))
                    entropies.append(_masked_mean(new.entropy, o.mask))
                losses.append(loss.item())
                norms.append(norm.item())
                clipfracs.append(clipfrac.item())
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731  (NaN propagates: non-finite = collapse)
        return {
            M.POLICY_LOSS: mean(losses), M.POLICY_GRAD_NORM: mean(norms), M.POLICY_CLIPFRAC: mean(clipfracs),
            M.POLICY_APPROX_KL: mean(kls), M.POLICY_ENTROPY: mean(entropies[: tr.num_minibatches]),
        }


def _t_masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)
