"""The metric catalogue: every name a run logs, in one place.

Both backends log these names; `analysis` reads them (and imports nothing else from `harness`).
docs/metrics.md's metric table is generated from `CATALOGUE` (``python -m harness.metrics``).

Notation per response token (docs/design.md section 2): ``logp_roll`` the inference engine's
sampling log-prob, ``logp_rec`` the training engine's log-prob under the pre-update weights,
``logp_old`` the estimator's IS denominator, ``logp_new`` the weights being optimised. "Response tokens" are
those the policy sampled: a multi-turn rollout's observation and padding enter no metric (docs/design.md
section 2, "Masks").
"""
from __future__ import annotations

REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_ACCURACY = "reward/accuracy"
POLICY_LOSS = "policy/loss"
POLICY_ENTROPY = "policy/entropy"
POLICY_GRAD_NORM = "policy/grad_norm"
POLICY_CLIPFRAC = "policy/clipfrac"
POLICY_APPROX_KL = "policy/approx_kl"
POLICY_UPDATE_NORM = "policy/update_norm"
MISMATCH_K1 = "mismatch/k1"
MISMATCH_K3 = "mismatch/k3"
MISMATCH_REC_K1 = "mismatch/rec_k1"
MISMATCH_REC_K3 = "mismatch/rec_k3"
MISMATCH_PROB_DIFF_MAX = "mismatch/prob_diff_max"
MISMATCH_PROB_DIFF_MEAN = "mismatch/prob_diff_mean"
MISMATCH_ABS_DIFF = "mismatch/abs_diff"
MISMATCH_BIAS_SQ = "mismatch/bias_sq"
MISMATCH_OUTSIDE_SUPPORT = "mismatch/outside_support_frac"
IS_WEIGHT_MEAN = "is/weight_mean"
IS_WEIGHT_MAX = "is/weight_max"
IS_ESS = "is/ess"
IS_MASKED_FRAC = "is/masked_frac"
MOE_ROUTING_FLIP_RATE = "moe/routing_flip_rate"
MOE_ROUTER_KL = "moe/router_kl"
MOE_REPLAY_COVERAGE = "moe/replay_coverage"
MOE_REPLAY_DRIFT = "moe/replay_drift"
#: logged only by runs of a multi-turn task (a prefix cache between turns) with a MoE
MULTI_TURN_ONLY = (MOE_REPLAY_COVERAGE, MOE_REPLAY_DRIFT)
NOISE_VAR_ROLLOUT = "noise/var_rollout"
TIME_ROLLOUT = "time/rollout_s"
TIME_OLD_LOGPROB = "time/old_logprob_s"
TIME_UPDATE = "time/update_s"
TIME_DIAGNOSTICS = "time/diagnostics_s"
TIME_STEP = "time/step_s"
TIME_ROLLOUT_WAIT = "time/rollout_wait_s"
TOKENS_PER_S = "tokens/per_s"
# KL-held runs only (inference.kl_target > 0, harness/backends/local/kl_control.py)
PERTURB_SCALE = "perturb/scale"
PERTURB_LEVEL = "perturb/level"
KL_HELD_ONLY = (PERTURB_SCALE, PERTURB_LEVEL)  # absent from other runs by design
# noise-probe runs only (``python -m harness.probe``, tag ``probe=1``): one value each, at step 0
PROBE_DIFF = "probe/diff"
PROBE_VAR_ROLLOUT = "probe/var_rollout"
PROBE_VAR_TRAIN = "probe/var_train"
PROBE_METRICS = (PROBE_DIFF, PROBE_VAR_ROLLOUT, PROBE_VAR_TRAIN)

# name -> one-line meaning of every per-step metric a training run logs (docs/metrics.md's table is
# generated from this and PROBE_CATALOGUE).
CATALOGUE: dict[str, str] = {
    REWARD_MEAN: "mean task reward of the rollout batch (partial credit in [0, 1])",
    REWARD_STD: "std of the reward over the rollout batch",
    REWARD_ACCURACY: "share of responses that are exactly right",
    POLICY_LOSS: "the estimator's loss (PPO-clipped; gmpo_rs: GMPO's), mean over the minibatch updates (non-finite = collapse)",
    POLICY_ENTROPY: "mean per-token entropy of the training policy over the first epoch of updates",
    POLICY_GRAD_NORM: "gradient norm before clipping, mean over the updates",
    POLICY_CLIPFRAC: "share of tokens whose ratio was clipped (gmpo_rs: log-ratio outside +-log_clip)",
    POLICY_APPROX_KL: "k3 estimate of KL(pi_old || pi_new) during the update",
    POLICY_UPDATE_NORM: ("L2 norm of the step's parameter change (all its minibatch updates, after clipping and "
                         "Adam): how far the step moved the policy (issue 31's conservative-update control)"),
    MISMATCH_K1: "k1 = -d, d = logp_old - logp_roll, token mean (the estimator's denominator)",
    MISMATCH_K3: "k3 = exp(d) - d - 1, token mean (the estimator's denominator)",
    MISMATCH_REC_K1: "k1 with logp_rec in place of logp_old (train-inference mismatch)",
    MISMATCH_REC_K3: "k3 with logp_rec in place of logp_old (train-inference mismatch)",
    MISMATCH_PROB_DIFF_MAX: "max |p_rec - p_roll| over response tokens",
    MISMATCH_PROB_DIFF_MEAN: "mean |p_rec - p_roll| over response tokens",
    MISMATCH_ABS_DIFF: "mean |logp_rec - logp_roll| over response tokens: the noise probe's diff (KwaiKAT's 0.008), per step",
    MISMATCH_BIAS_SQ: "(logp_rec - mean_i logp_inf[i])^2, token mean over the noise passes' sequences: the bias term "
                      "of E_i[(logp_rec - logp_inf[i])^2] = bias_sq + noise/var_rollout (its variance term)",
    MISMATCH_OUTSIDE_SUPPORT: "share of the diagnostic passes' token scores with probability 0 (processed mode with "
                              "top-k/top-p: the sampled token outside that pass's nucleus); those tokens are left out "
                              "of bias_sq and var_rollout",
    IS_WEIGHT_MEAN: "mean effective IS weight w * exp(logp_rec - logp_old) at the start of the update",
    IS_WEIGHT_MAX: "max of that weight (its tail)",
    IS_ESS: ("normalised effective sample size (sum w)^2 / (N sum w^2) of that weight over the estimator's N tokens "
             "(its mask; zero weights count in N); 0 without tokens or weight mass"),
    IS_MASKED_FRAC: "share of response tokens the estimator masked (MIS, Geo-RS, IcePop)",
    MOE_ROUTING_FLIP_RATE: "share of tokens whose top-k set differs between rollout and training, any layer",
    MOE_ROUTER_KL: "KL(router_rollout || router_train), mean over tokens and layers",
    MOE_REPLAY_COVERAGE: "multi-turn tasks: share of the positions whose routing R3 replays (every processed "
                         "non-padding position) that carry their sampling-time routing, not one recomputed after a "
                         "prefix-cache eviction or left missing (1.0 with a full cache; absent on single-turn tasks)",
    MOE_REPLAY_DRIFT: "multi-turn tasks: share of those positions replayed with a recomputed routing whose top-k "
                      "set differs, in some layer, from the sampling-time one (0 with a full cache or "
                      "replay_on_miss=missing)",
    NOISE_VAR_ROLLOUT: "Var_i(logp_inf[i]) over diagnostics.noise_passes fresh scorings, token mean: the variance "
                       "term of the mean squared train-inference log-ratio (mismatch/bias_sq the bias term)",
    TIME_ROLLOUT: "seconds spent generating the rollout batch",
    TIME_OLD_LOGPROB: "seconds spent by the estimator computing pi_old (its cost)",
    TIME_UPDATE: "seconds spent in the PPO updates",
    TIME_DIAGNOSTICS: "seconds spent on diagnostics that are not part of the estimator",
    TIME_STEP: "wall seconds of the whole step",
    TIME_ROLLOUT_WAIT: ("seconds the step waited for its rollout batch: all of collecting it without overlap; "
                        "with trainer.overlap only what the previous update did not hide"),
    TOKENS_PER_S: "generated response tokens per second of rollout",
    PERTURB_SCALE: "KL-held runs only (inference.kl_target > 0): the scale c_t this step's perturbation ran at "
                   "(sigma_0 c_t, or delta_0 ** c_t for the bias), set from the earlier steps' mismatch/rec_k3",
    PERTURB_LEVEL: "KL-held runs only: that perturbation's level this step (router/logit sigma, or the bias delta)",
}

# Logged once (step 0) by noise-probe runs (tag ``probe=1``), not by training runs.
PROBE_CATALOGUE: dict[str, str] = {
    PROBE_DIFF: "probe runs: mean |logp_train - logp_inf| per response token",
    PROBE_VAR_ROLLOUT: "probe runs: variance of the inference engine's token log-prob over repeated passes",
    PROBE_VAR_TRAIN: "probe runs: the same over repeated training-engine passes",
}

# KwaiKAT's noise table (Qwen3-235B-A22B / its dense counterpart on verl), beside which the probe is read.
KWAIKAT_PROBE: dict[str, dict[str, float]] = {
    "dense": {PROBE_DIFF: 0.002, PROBE_VAR_ROLLOUT: 1e-5, PROBE_VAR_TRAIN: 0.0},
    "moe": {PROBE_DIFF: 0.008, PROBE_VAR_ROLLOUT: 1e-3, PROBE_VAR_TRAIN: 1e-7},
}

# Tags every run carries (MLflow tags), used by analysis for grouping.
RUN_TAGS = ("estimator", "n", "clip_c", "seed", "backend", "model", "task", "spec_sig", "git_commit")
# Experiment tags (MLflow experiment tags the harness sets): "primary": a sweep's primary contrasts and when they
# were declared, JSON (harness/launch/primary.py)
EXPERIMENT_TAGS = {"primary": "primary_contrasts"}


def markdown_table() -> str:
    rows = ["| metric | meaning |", "|---|---|"]
    rows += [f"| `{k}` | {v.replace('|', chr(92) + '|')} |"  # \| keeps a cell whole
             for k, v in {**CATALOGUE, **PROBE_CATALOGUE}.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
