"""GRPO/PPO training steps of the local backend for a seed pack (S seeds of one spec), and the
per-seed state for exact resume. A plain run is a pack of one (``LocalTrainer``).

    rollout  : InferenceEngine.generate          -> tokens, logp_roll, routed experts   [S, B, ...]
               (a multi-turn task: generate_turns, with the response mask m: 1 = a token the policy sampled)
    reward   : task reward (of the final answer), GRPO advantages A = (r - mean_group) / (std_group + eps)
    old      : Estimator.old_policy(context)      -> OldPolicy(logp, weight, mask, replay)
    update   : ppo_epochs x num_minibatches optimiser steps on, per seed,
               L_s = -sum_t m_t w_t min(r_t A, clip(r_t, 1-eps, 1+eps) A) / sum_t m_t
    sync     : the inference engine reloads the new weights (as verl syncs vLLM)

Every tensor carries the seed axis (stacked weights, batched GEMMs); the estimator sees the S x B
rows of the pack as one batch (its hooks are row-wise, its loss unreduced terms, which ``agg.agg_loss``
reduces per seed). Every random draw comes from the seed's
own named generators, checkpointed per seed, and every per-seed quantity (loss, gradient norm,
optimiser step, metrics) is reduced within the seed's slice only: a seed's curve is bitwise the
same alone or in a pack (tests/backends/local/test_pack.py). The trainer only calls the
estimator's hooks; it never branches on an estimator's name.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch
from torch import Tensor

from harness import estimators
from harness import metrics as M
from harness.backends.local import philox
from harness.backends.local.agg import agg_loss
from harness.backends.local.inference_engine import InferenceEngine, Rollout
from harness.backends.local.kl_control import KLController
from harness.backends.local.model import PolicyPack
from harness.backends.local.optim import PackAdamW
from harness.backends.local.prefix_cache import replay_coverage
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.backends.local.warmstart import warm_start_pack
from harness.spec import RunConfig
from harness.estimators.base import OldPolicy, PolicyForward
from harness.estimators.losses import ppo_terms
from harness.tasks.vocab import PAD


def grpo_advantages(reward: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages: (r - mean_group) / (std_group + eps), one per sequence."""
    g = reward.view(-1, group_size)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + eps)).view(-1)


def ppo_loss(ratio: Tensor, adv: Tensor, weight: Tensor, mask: Tensor, clip_eps: float) -> tuple[Tensor, Tensor]:
    """Token-mean PPO-clipped loss over unmasked tokens [B, R], and the clipped share (one seed)."""
    loss, clipfrac = agg_loss(ppo_terms(ratio, adv, weight, mask, clip_eps), mask, 1)
    return loss[0], clipfrac[0]


class OldPolicyContext:
    """Lazy, cached access to what estimators may use; each quantity is computed once. For a pack
    of S seeds every tensor is [S B, ...] (seed-major rows)."""

    def __init__(self, train: TrainEngine, infer: InferenceEngine, roll: Rollout, prompt_len: int, mask: Tensor,
                 size: int = 1, scores: Tensor | None = None):
        self.train, self.infer, self.roll, self.prompt_len, self.size = train, infer, roll, prompt_len, size
        self.logp_roll = roll.logp
        self.mask = mask
        self.routed_experts = roll.routed_experts
        self._recompute: dict[bool, PolicyForward] = {}
        self._scores: Tensor | None = scores  # already scored on the rollout side (trainer.overlap: overlap.py)

    def recompute(self, replay: Tensor | None = None) -> PolicyForward:
        plain = self._recompute.get(False)
        if plain is not None and replay is not None and replay is plain.routes:
            return plain  # its own routes replayed (r2): the same forward, bitwise (tests/estimators/test_r2.py)
        key = replay is not None
        if key not in self._recompute:
            self._recompute[key] = self.train.logprobs(self.roll.tokens, self.prompt_len, replay)
        return self._recompute[key]

    def score(self, n: int) -> Tensor:
        """[n, S B, R] fresh inference scorings (one batched forward over S x n x B rows)."""
        if self._scores is None or self._scores.shape[0] != n:
            tokens = self.roll.tokens
            if self.infer.packed:
                s = self.infer.score(tokens.view(self.size, -1, tokens.shape[-1]), self.prompt_len, n)  # [S, n, B, R]
                self._scores = s.transpose(0, 1).reshape(n, -1, s.shape[-1])
            else:
                self._scores = self.infer.score(tokens, self.prompt_len, n)
        return self._scores


@dataclasses.dataclass
class Batch:
    """A collected rollout batch ([S B, ...] rows, seed-major): what ``learn`` trains on."""

    roll: Rollout
    prompt_len: int
    mask: Tensor  # [S B, R] 1 = a policy token that enters the loss and every estimator's sums
    reward: Tensor  # [S B]
    exact: Tensor  # [S B]
    adv: Tensor  # [S B]
    t_rollout: float  # wall seconds of the generate call
    scores: Tensor | None = None  # [n, S B, R] the estimator's inference passes, made on the rollout side (overlap)
    noise_scores: Tensor | None = None  # [S, n, B', R] the diagnostic passes, made on the rollout side (overlap)


def noise_terms(logp_rec: Tensor, logp_inf: Tensor, policy: Tensor | None = None) -> dict[str, Tensor]:
    """The noise and bias terms of the mean squared train-inference log-ratio, per seed, from n diagnostic
    passes: logp_rec [S, B, R], logp_inf [S, n, B, R] -> {name: [S]}. Per token, exactly (population variance):

        mean_i (logp_rec - logp_inf[i])^2 = (logp_rec - mean_i logp_inf[i])^2 + Var_i(logp_inf[i])
                                          =      mismatch/bias_sq               +  noise/var_rollout

    token means over the diagnostic sequences (over the policy's tokens only when ``policy`` [S, B, R] is given:
    a multi-turn rollout). With top-k / top-p in ``processed`` mode a pass can give the sampled token
    probability 0 (log-prob -inf: outside that pass's nucleus): such tokens are left out of both terms (a
    single-turn seed without any keeps the plain token mean, bitwise) and counted in
    ``mismatch/outside_support_frac``."""
    var, bias = logp_inf.var(1, unbiased=False), (logp_rec - logp_inf.mean(1)).pow(2)
    finite = torch.isfinite(logp_inf).all(1)  # [S, B, R]
    outside = (~torch.isfinite(logp_inf)).float()  # [S, n, B, R]
    if policy is not None:
        keep = finite & (policy > 0)
        return {M.NOISE_VAR_ROLLOUT: _seed_mean(var, keep.float()), M.MISMATCH_BIAS_SQ: _seed_mean(bias, keep.float()),
                M.MISMATCH_OUTSIDE_SUPPORT: _seed_mean(outside.mean(1), policy)}
    plain = finite.flatten(1).all(1)

    def mean(x: Tensor) -> Tensor:
        return torch.where(plain, x.flatten(1).mean(1), _seed_mean(x.masked_fill(~finite, 0.0), finite.float()))

    return {M.NOISE_VAR_ROLLOUT: mean(var), M.MISMATCH_BIAS_SQ: mean(bias),
            M.MISMATCH_OUTSIDE_SUPPORT: outside.flatten(1).mean(1)}


def _seed_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Masked mean within each seed's slice: [S, ...] -> [S], sum_t m_t x_t / sum_t m_t (a masked x_t is never
    read, even when not finite)."""
    dims = tuple(range(1, x.dim()))
    return torch.where(mask > 0, x, 0.0).sum(dims) / mask.sum(dims).clamp(min=1.0)


def _token_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean over each seed's tokens [S, B, R, ...] -> [S]: every token (``mask`` None: a single-turn rollout), or
    the policy's tokens only (mask [S, B, R]: observation and padding excluded)."""
    if mask is None:
        return x.flatten(1).mean(1)
    return _seed_mean(x.flatten(3).mean(3) if x.dim() > 3 else x, mask)


def is_ess(w: Tensor, mask: Tensor) -> Tensor:
    """Normalised effective sample size of the IS weights w [S, B, R] over each seed's tokens (mask > 0), [S]:
    (sum_t w_t)^2 / (N sum_t w_t^2), N = the seed's token count (zero weights included): 1 for equal weights,
    1/N for one non-zero weight; 0 for a seed without tokens or whose weights are all 0 (IcePop masking every one)."""
    m = mask > 0
    count = m.flatten(1).sum(1)
    sq = (w * w * m).flatten(1).sum(1)
    ess = (w * m).flatten(1).sum(1) ** 2 / (count.clamp(min=1) * sq)
    return torch.where((count > 0) & (sq > 0), ess, 0.0)


def routing_flip_rate(roll_selected: Tensor, rec_selected: Tensor, mask: Tensor | None) -> Tensor:
    """Share of each seed's tokens whose top-k expert set differs between rollout and training in any layer, [S]:
    mean_t 1[exists l: set(roll_selected[t, l]) != set(rec_selected[t, l])], selected [S, B, R, L, k]; over every
    token (``mask`` None), or over the tokens of ``mask`` [S, B, R] whose rollout routing is known (no id -1 in
    any layer: replay_on_miss=missing)."""
    roll, rec = roll_selected.sort(-1).values, rec_selected.sort(-1).values
    flips = (roll != rec).any(-1).any(-1).float()
    known = mask if mask is None else mask * (roll >= 0).all(-1).all(-1).float()
    return _token_mean(flips, known)


def router_kl(roll_logp: Tensor, rec_logp: Tensor, mask: Tensor | None) -> Tensor:
    """KL(router_rollout || router_train) = sum_e p_roll,e (log p_roll,e - log p_rec,e) from router log-probs
    [S, B, R, L, E], mean over layers and tokens (every token, or those of ``mask`` [S, B, R]), [S]."""
    return _token_mean((roll_logp.exp() * (roll_logp - rec_logp)).sum(-1), mask)


class StepAborted(Exception):
    """A stop was asked for (SIGTERM/SIGINT, ``PackTrainer.stop_check``) between two phases of a step: the step is
    abandoned and the trainer's memory is not a state to save; the run's state is its last checkpoint, from which
    the same command recomputes the lost steps bitwise."""


class PackTrainer:
    """S seeds of one spec (``cfgs`` differ only in ``seed``) trained as one stacked model."""

    def __init__(self, cfgs: list[RunConfig], device: torch.device):
        sigs = {c.group_signature for c in cfgs}
        if len(sigs) != 1:
            raise ValueError(f"a seed pack trains seeds of one spec; got specs {sorted(sigs)}")
        self.cfgs, self.cfg, self.device = cfgs, cfgs[0], device
        # asked between the phases of a step (rollout, pi_old, diagnostics, each minibatch): True -> StepAborted, so
        # a signal is honoured within one phase, not one step (a long step would outlast Slurm's KillWait)
        self.stop_check: Callable[[], bool] | None = None
        self.seeds = [c.seed for c in cfgs]
        self.size = len(cfgs)
        cfg = self.cfg
        # set up in bulk: cached seeds read, the others warmed up together on the device (warmstart.py)
        self.policy, self.warmstarts = warm_start_pack(cfg.model, cfg.task, self.seeds, device)
        self.train = TrainEngine(self.policy, cfg.inference.temperature)
        self.estimator = estimators.build(cfg.estimator)
        self.infer = InferenceEngine(self.policy, self.estimator.inference(cfg.inference), self.seeds, device)
        self.infer.boundary = self.phase_boundary  # also between a rollout's decode steps
        self.task = Task(cfg.task)
        # the trainer's own draws (prompts, minibatch shuffles) are keyed like the engine's (philox.py): a pure
        # function of (seed, stream, step, ...), so a resumed seed needs only its step
        self.seed_keys = torch.tensor(self.seeds, dtype=torch.int64)
        tr = cfg.trainer
        self.opt = PackAdamW(self.policy.weights(), lr=tr.lr, weight_decay=tr.weight_decay)
        self.step = 0
        # a KL-held run (inference.kl_target > 0): the perturbation's per-seed scale, set from the measured KL
        self.kl = KLController(self.infer.cfg, self.size) if cfg.inference.kl_target > 0 else None
        self._set_scale()

    def _set_scale(self) -> None:
        if self.kl is not None:
            self.infer.scale = self.kl.scale.to(self.device)

    # ---------------------------------------------------------------------------- state
    def seed_state(self, s: int) -> dict:
        """Everything seed ``s`` needs to resume, alone or in any pack."""
        return {
            "step": self.step,
            "policy": self.policy.policy_state(s),
            "opt": self.opt.state(s),
            "infer": self.infer.state(s),
            **({"kl": self.kl.state(s)} if self.kl is not None else {}),
        }

    def load_seed_state(self, s: int, state: dict) -> None:
        if state["step"] != self.step and s > 0:
            raise ValueError(f"seed {self.seeds[s]} is at step {state['step']}, the pack at {self.step}")
        self.step = state["step"]
        self.policy.load_policy_state(s, state["policy"])
        self.opt.load_state(s, state["opt"])
        self.infer.load_state(state["infer"], s)
        self.infer.load_weights(self.policy)
        if self.kl is not None:
            self.kl.load_state(s, state["kl"])
            self._set_scale()

    # ----------------------------------------------------------------------------- step
    def phase_boundary(self) -> None:
        """Raise :class:`StepAborted` when a stop was asked for (``stop_check``)."""
        if self.stop_check is not None and self.stop_check():
            raise StepAborted(f"step {self.step} abandoned between two of its phases")

    def step_seeds(self) -> list[dict[str, float]]:
        """One step of every seed; the metrics of each seed (the run loop's step, ``run.py``)."""
        t_step = time.perf_counter()
        batch = self.collect()
        self.phase_boundary()
        t_wait = time.perf_counter() - t_step
        per_seed = self.learn(batch, t_step)
        for values in per_seed:
            values[M.TIME_ROLLOUT_WAIT] = t_wait
        return per_seed

    def close(self) -> None:
        """Release what the trainer holds outside this process (nothing here; overlap.py's rollout worker)."""

    def collect(self) -> Batch:
        """The rollout half of a step: sample prompts, generate with the inference engine's current
        weights, score the rewards and GRPO advantages."""
        tr, dev = self.cfg.trainer, self.device
        self.infer.begin_step(self.step)  # the engine's keyed draws of this step (philox.py)
        n_s, n_p = self.size, tr.prompts_per_step
        source = philox.KeyedInts(self.seed_keys, "data", self.step)  # every seed's prompts in one draw
        prompts, answers = (x.view(n_s, n_p, -1).repeat_interleave(tr.group_size, 1).to(dev)  # [S, B, P], [S, B, A]
                            for x in self.task.sample(n_s * n_p, source))
        pl = self.task.prompt_len

        t = time.perf_counter()
        roll = self.task.rollout(self.infer, prompts).map(lambda v: v.flatten(0, 1))  # [S B, ...]
        t_roll = time.perf_counter() - t
        reward, exact = self.task.reward(self.task.final(roll.tokens), answers.flatten(0, 1))  # the final answer
        adv = grpo_advantages(reward, tr.group_size)
        mask = torch.ones_like(roll.logp) if roll.mask is None else roll.mask
        return Batch(roll, pl, mask, reward, exact, adv, t_roll)

    def learn(self, batch: Batch, t_step: float | None = None) -> list[dict[str, float]]:
        """The training half of a step on a collected batch: pi_old (the estimator), diagnostics, the
        PPO update, the weight sync to the inference engine; the metrics of each seed."""
        t_step = time.perf_counter() if t_step is None else t_step
        n_s, roll, pl, mask, reward, exact, adv = (self.size, batch.roll, batch.prompt_len, batch.mask, batch.reward,
                                                   batch.exact, batch.adv)
        ctx = OldPolicyContext(self.train, self.infer, roll, pl, mask, n_s, batch.scores)
        t = time.perf_counter()
        old = self.estimator.old_policy(ctx)
        t_old = time.perf_counter() - t
        self.phase_boundary()

        t = time.perf_counter()
        noise = batch.noise_scores if batch.noise_scores is not None else self.noise_scores(roll)
        out = self._diagnostics(ctx, old, roll, mask, noise)
        if self.kl is not None:  # the scale this step ran at
            out.update(self.kl.metrics())
        t_diag = time.perf_counter() - t
        self.phase_boundary()

        t = time.perf_counter()
        out.update(self._update(roll.tokens, pl, adv, old))
        t_update = time.perf_counter() - t
        self.sync_weights()
        if self.kl is not None:  # the next step's scale, from this step's train-inference KL
            self.kl.update(out[M.MISMATCH_REC_K3])
            self._set_scale()
        self.step += 1

        t_all = time.perf_counter() - t_step
        r = reward.view(n_s, -1)
        out.update({M.REWARD_MEAN: r.mean(1), M.REWARD_STD: r.std(1), M.REWARD_ACCURACY: exact.view(n_s, -1).mean(1)})
        keys = list(out)
        table = torch.stack([out[k].detach().double().reshape(n_s) for k in keys], 1).tolist()  # one sync
        per_seed = [dict(zip(keys, row)) for row in table]
        tokens = roll.logp.numel() // n_s
        t_roll = batch.t_rollout
        for values in per_seed:  # wall times are the pack's (per step of every seed together)
            values.update({M.TIME_ROLLOUT: t_roll, M.TIME_OLD_LOGPROB: t_old, M.TIME_UPDATE: t_update,
                           M.TIME_DIAGNOSTICS: t_diag, M.TIME_STEP: t_all,
                           M.TOKENS_PER_S: tokens / max(t_roll, 1e-9)})
        return per_seed

    def _diagnostics(self, ctx: OldPolicyContext, old: OldPolicy, roll: Rollout, mask: Tensor,
                     noise_scores: Tensor | None = None) -> dict[str, Tensor]:
        n_s = self.size
        seeds = lambda x: x.reshape(n_s, -1, *x.shape[1:])  # noqa: E731  [S B, ...] -> [S, B, ...]
        out: dict[str, Tensor] = {}
        logp_roll, m = seeds(roll.logp), seeds(mask)
        policy = None if roll.mask is None else m  # means over the policy's tokens (multi-turn), else every token
        rec = ctx.recompute()  # plain recompute (cached when the estimator used it)
        for prefix, logp in (("", old.logp), ("rec_", rec.logp)):
            d = seeds(logp) - logp_roll
            out[f"mismatch/{prefix}k1"] = _seed_mean(-d, m)
            out[f"mismatch/{prefix}k3"] = _seed_mean(torch.expm1(d) - d, m)
        pdiff = (seeds(rec.logp).exp() - logp_roll.exp()).abs()
        out[M.MISMATCH_PROB_DIFF_MAX] = pdiff.masked_fill(m == 0, 0.0).flatten(1).amax(1)
        out[M.MISMATCH_PROB_DIFF_MEAN] = _seed_mean(pdiff, m)
        out[M.MISMATCH_ABS_DIFF] = _seed_mean((seeds(rec.logp) - logp_roll).abs(), m)  # the probe's diff, per step

        # the effective IS weight of the first update, under the pre-update weights
        start = ctx.recompute(old.replay)
        w = seeds(old.weight * torch.exp((start.logp - old.logp).clamp(max=50.0)))
        om = seeds(old.mask) > 0
        count = om.flatten(1).sum(1)
        w_sum = (w * om).flatten(1).sum(1)
        out[M.IS_WEIGHT_MEAN] = torch.where(count > 0, w_sum / count.clamp(min=1), float("nan"))
        out[M.IS_WEIGHT_MAX] = torch.where(count > 0, w.masked_fill(~om, float("-inf")).flatten(1).amax(1),
                                           float("nan"))
        out[M.IS_ESS] = is_ess(w, om)
        kept = seeds(old.mask * (old.weight != 0)).flatten(1).sum(1)
        out[M.IS_MASKED_FRAC] = 1.0 - kept / m.flatten(1).sum(1)

        if roll.routed_experts is not None and rec.selected is not None:
            roll_sel = seeds(roll.routed_experts[:, self.task.prompt_len - 1:-1])  # the predicting positions
            out[M.MOE_ROUTING_FLIP_RATE] = routing_flip_rate(roll_sel, seeds(rec.selected), policy)
            out[M.MOE_ROUTER_KL] = router_kl(seeds(roll.router_logp), seeds(rec.router_logp), policy)
        if roll.routing_origin is not None:  # multi-turn MoE: what the prefix cache left of the sampling-time routing
            out[M.MOE_REPLAY_COVERAGE], out[M.MOE_REPLAY_DRIFT] = replay_coverage(seeds(roll.tokens),
                                                                                  seeds(roll.routing_origin), PAD)

        if noise_scores is not None:
            diag = self.cfg.diagnostics
            out.update(noise_terms(seeds(rec.logp)[:, : diag.noise_sequences], noise_scores,
                                   None if policy is None else policy[:, : diag.noise_sequences]))
        return out

    def noise_scores(self, roll: Rollout) -> Tensor | None:
        """The diagnostic passes [S, n, B', R]: ``diagnostics.noise_passes`` fresh inference scorings of the first
        ``noise_sequences`` sequences of each seed (None when off), from which ``_diagnostics`` logs
        noise/var_rollout and mismatch/bias_sq (``noise_terms``)."""
        diag = self.cfg.diagnostics
        if diag.noise_passes < 2:
            return None
        rows = roll.tokens.reshape(self.size, -1, roll.tokens.shape[-1])[:, : diag.noise_sequences]
        return self.infer.score(rows, self.task.prompt_len, diag.noise_passes, stream="score")

    def sync_weights(self) -> None:
        """After an update: the inference engine loads the new weights (as verl syncs vLLM)."""
        self.infer.load_weights(self.policy)

    def _update(self, tokens: Tensor, pl: int, adv: Tensor, old: OldPolicy) -> dict[str, Tensor]:
        tr, n_s = self.cfg.trainer, self.size
        b = tokens.shape[0] // n_s
        mb = b // tr.num_minibatches
        params = self.policy.weights()
        max_norm = tr.max_grad_norm if tr.max_grad_norm is not None else math.inf
        seeds = lambda x: x.reshape(n_s, -1, *x.shape[1:])  # noqa: E731
        losses, norms, clipfracs, kls, entropies = [], [], [], [], []
        offset = (torch.arange(n_s) * b)[:, None]
        before = {k: p.detach().clone() for k, p in params.items()}
        for epoch in range(tr.ppo_epochs):
            perm = philox.permutation(self.seed_keys, "shuffle", self.step, epoch, b) + offset  # [S, B]
            for i in range(tr.num_minibatches):
                self.phase_boundary()
                idx = perm[:, i * mb:(i + 1) * mb].reshape(-1).to(tokens.device)  # seed-major rows
                o = old.select(idx)
                new = self.train.forward(tokens[idx], pl, o.replay, with_entropy=True)
                terms = self.estimator.loss(new.logp, o, new, adv[idx, None], tr.clip_eps)
                loss, clipfrac = agg_loss(terms, o.mask, n_s)  # per seed, within its slice
                if tr.entropy_coef:
                    loss = loss - tr.entropy_coef * _seed_mean(seeds(new.entropy), seeds(o.mask))
                self.opt.zero_grad()
                loss.sum().backward()  # the seeds' graphs are disjoint: each slice gets its own gradient
                norm = torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), dim=1) for p in params.values()], 1)
                norm = torch.linalg.vector_norm(norm, dim=1)  # [S], as clip_grad_norm_ per seed
                if math.isfinite(max_norm):
                    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
                    for p in params.values():
                        p.grad.mul_(coef.view(-1, *([1] * (p.dim() - 1))))
                self.opt.step(torch.isfinite(loss) & torch.isfinite(norm))
                with torch.no_grad():
                    log_r = (new.logp - o.logp).clamp(-50, 50)
                    kls.append(_seed_mean(seeds(torch.expm1(log_r) - log_r), seeds(o.mask)))
                    entropies.append(_seed_mean(seeds(new.entropy), seeds(o.mask)))
                losses.append(loss.detach())
                norms.append(norm)
                clipfracs.append(clipfrac)
        mean = lambda xs: torch.stack(xs).sum(0) / len(xs)  # noqa: E731  (NaN propagates: non-finite = collapse)
        with torch.no_grad():  # the step's parameter change per seed: how far the update moved the policy
            moved = torch.stack([torch.linalg.vector_norm((p.detach() - before[k]).flatten(1), dim=1)
                                 for k, p in params.items()], 1)
        return {
            M.POLICY_UPDATE_NORM: torch.linalg.vector_norm(moved, dim=1),
            M.POLICY_LOSS: mean(losses), M.POLICY_GRAD_NORM: mean(norms), M.POLICY_CLIPFRAC: mean(clipfracs),
            M.POLICY_APPROX_KL: mean(kls), M.POLICY_ENTROPY: mean(entropies[: tr.num_minibatches]),
        }


class LocalTrainer(PackTrainer):
    """One run: a pack of one seed, with a single-run API (``run_step``, ``state_dict``) for scripts, benchmarks
    and tests; the run loop (``run.py``) drives every trainer as a pack."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        super().__init__([cfg], device)

    @property
    def warmstart(self) -> dict:
        return self.warmstarts[0]

    def state_dict(self) -> dict:
        return self.seed_state(0)

    def load_state_dict(self, state: dict) -> None:
        self.load_seed_state(0, state)

    def run_step(self) -> dict[str, float]:
        """One step of the run: its metrics."""
        return self.step_seeds()[0]
