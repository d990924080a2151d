"""Every estimator's override list composes with verl's own ppo_trainer.yaml and passes verl's checks.

The overrides are applied through Hydra's compose API to the ``trainer/config`` tree installed with
verl 0.9.1 (nothing re-typed here), then go through what ``main_ppo`` runs before it needs GPUs:
``validate_config`` (which builds the actor dataclass) and the dataclass builds of the other
sections (algorithm, rollout correction, rollout, model).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness import estimators
from harness.spec import ConfigError

from harness.backends.verl import translate
from harness.tags import run_tags

#: arguments beyond an estimator's defaults that a case needs (a registered estimator without an entry has none)
ROUTER_SHIFT = ("rais", "gmpo_rs")  # on the FSDP engine only (our router patch), behind verl.experimental_rais
EXTRA_ARGS = {"tis": ["estimator.level=sequence"], "mean_n": ["estimator.n=4"],
              **{e: ["verl.experimental_rais=true"] for e in ROUTER_SHIFT}}
MOE_FSDP = "model=qwen3_30b_a3b_fsdp"
MOE, DENSE = "model=qwen3_30b_a3b", "model=qwen3_4b"
pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")
MAPPED = [e for e in estimators.NAMES if estimators.get(e).verl is not None]
# every mapped estimator on the MoE/megatron preset; the dense/FSDP2 preset with one of each kind of mapping
CASES = ([(e, MOE) for e in MAPPED if e not in ROUTER_SHIFT]
         + [(e, MOE_FSDP) for e in (*ROUTER_SHIFT, "mis", "deterministic")]
         + [(e, DENSE) for e in ("rollout", "recompute", "mis", "mean_n")])


def _verl_checks(vc) -> dict:
    """What main_ppo does with a composed config before it starts Ray (plus the dataclass builds)."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    validate_config(config=vc, use_reference_policy=need_reference_policy(vc), use_critic=need_critic(vc))
    algo = omega_conf_to_dataclass(vc.algorithm)
    assert isinstance(algo, AlgoConfig)
    rc = omega_conf_to_dataclass(vc.algorithm.rollout_correction, dataclass_type=RolloutCorrectionConfig)
    actor = omega_conf_to_dataclass(vc.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(vc.actor_rollout_ref.rollout)
    assert isinstance(rollout, RolloutConfig)
    get_adv_estimator_fn(vc.algorithm.adv_estimator)
    assert not need_critic(vc) and not need_reference_policy(vc)  # GRPO, no KL: as the harness's loss
    return {"rc": rc, "actor": actor, "rollout": rollout}


@pytest.mark.parametrize("estimator,model", CASES, ids=[f"{e}-{m.split('=')[1]}" for e, m in CASES])
def test_overrides_compose_with_verl_and_pass_its_validation(spec, estimator, model):
    import harness.backends.verl.plugins  # noqa: F401  (registers harness_rais, harness_mean_n)
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

    cfg = spec(f"estimator={estimator}", model, *EXTRA_ARGS.get(estimator, []))
    vc = translate.verl_config(cfg, commit="abc123", check=False)
    built = _verl_checks(vc)
    rc, actor, rollout = built["rc"], built["actor"], built["rollout"]
    a, r, tr = vc.actor_rollout_ref.actor, vc.actor_rollout_ref.rollout, cfg.trainer

    # the estimator's own settings, as its module declares them (harness.estimators: needs, verl)
    est = estimators.get(estimator)
    mapping, needs = est.verl, est.needs
    assert rc.bypass_mode is mapping.bypass
    assert r.full_determinism is needs.deterministic
    assert r.enable_rollout_routing_replay is needs.replay
    if a.strategy == "megatron":
        assert a.megatron.router_replay.mode == ("R3" if needs.replay else mapping.router_replay or "disabled")
    assert get_policy_loss_fn(actor.policy_loss.loss_mode) is not None
    assert actor.policy_loss.loss_mode == mapping.loss_mode
    assert r.agent.default_agent_loop in _agent_loop_registry
    assert r.agent.default_agent_loop == (mapping.agent_loop or ("harness_deterministic" if needs.deterministic
                                                                 else "single_turn_agent"))
    assert vc.trainer.use_v1 is False  # verl's legacy trainer: its denominator is the harness's (issue 14)
    if rc.rollout_is is not None:
        _parse_rollout_is_threshold(rc.rollout_is_threshold)
    if mapping.correction is None:
        assert rc.rollout_is is None and rc.rollout_rs is None
    if not mapping.weighted:
        assert rc.rollout_is is None
    # the shipped mappings, pinned (bypass: pi_old from the rollout, no training forward)
    assert rc.bypass_mode is (estimator in ("rollout", "deterministic", "mean_n"))
    if estimator == "mean_n":
        assert vc.harness.mean_n == 4 and r.agent.default_agent_loop == "harness_mean_n"
    if estimator == "rais":
        assert actor.policy_loss.loss_mode == "harness_rais"
    if estimator == "gmpo_rs":  # verl's geo_mean on the shifted ratio; its log-space clip travels in the env
        assert actor.policy_loss.loss_mode == "harness_gmpo_rs"
        env_ = vc.ray_kwargs.ray_init.runtime_env.env_vars
        assert (env_.HARNESS_GMPO_LOG_CLIP, env_.HARNESS_RAIS_GAMMA_MIN, env_.HARNESS_RAIS) == ("0.4", "0.8", "1")
    if estimator == "r3":
        assert r.enable_rollout_routing_replay and a.megatron.router_replay.mode == "R3"
    if estimator == "tis":
        assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs) == ("sequence", 2.0, None)
    if estimator == "mean_n_tis":
        assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs) == ("sequence", 2.0, None)
        assert vc.harness.mean_n == 8 and r.agent.default_agent_loop == "harness_mean_n"
    if estimator == "icepop":
        assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", "0.5_5.0")
    if estimator == "geo_rs":  # verl's decoupled_geo_rs: k1 = -log ratio, so the band on g is inverted
        assert (rc.rollout_is, rc.rollout_rs) == (None, "seq_mean_k1")
        assert rc.rollout_rs_threshold == f"{1 / 1.02!r}_{1 / 0.98!r}"
    if estimator == "r2":  # Megatron records its own routes in the old-log-prob pass, replays them in the update
        assert a.megatron.router_replay.mode == "R2" and not r.enable_rollout_routing_replay

    # the shared spec: GRPO batch geometry, sampler, loss
    assert vc.algorithm.adv_estimator == "grpo" and vc.algorithm.norm_adv_by_std_in_grpo
    assert vc.data.train_batch_size == tr.prompts_per_step and r.n == tr.group_size
    assert a.ppo_mini_batch_size * tr.num_minibatches == tr.prompts_per_step
    assert actor.clip_ratio_low == actor.clip_ratio_high == tr.clip_eps
    assert actor.optim.lr == tr.lr and actor.loss_agg_mode == "token-mean" and not actor.use_kl_loss
    assert rollout.logprobs_mode == "processed_logprobs" and rollout.temperature == 1.0
    assert vc.trainer.total_training_steps == tr.steps
    assert list(vc.trainer.logger) == ["console", "mlflow"]
    assert vc.trainer.project_name == cfg.tracking.experiment
    env = vc.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "harness.backends.verl.plugins"
    assert all(isinstance(x, str) for x in env.values())  # Ray wants str -> str
    tags = vc.harness.tags
    assert {k: str(v) for k, v in tags.items()} == run_tags(cfg, commit="abc123")
    assert tags.spec_sig == cfg.signature and tags.backend == "verl"


def test_a_typo_in_a_key_fails_composition(spec):
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    cfg = spec("estimator=tis", MOE)
    bad = [o.replace("rollout_is_threshold", "rollout_is_treshold") for o in translate.overrides(cfg)]
    with pytest.raises(ConfigCompositionException):
        with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer/config"), version_base=None):
            compose(config_name="ppo_trainer", overrides=bad)


def test_model_section_builds_verl_hf_model_config(spec, tiny_hf_model, no_hf_network):
    """verl's HFModelConfig reads the checkpoint (config + tokenizer) our model.path points to."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    for model in (MOE, DENSE):
        cfg = spec("estimator=recompute", model, f"model.path={tiny_hf_model}")
        vc = translate.verl_config(cfg, check=False)
        hf = omega_conf_to_dataclass(vc.actor_rollout_ref.model)
        assert isinstance(hf, HFModelConfig) and hf.hf_config.model_type == "qwen3_moe"
        assert hf.architectures == ["Qwen3MoeForCausalLM"]


@pytest.mark.parametrize("estimator,level", [("tis", "token"), ("tis", "sequence"), ("mis", "token"),
                                             ("mis", "sequence"), ("icepop", "token")])
def test_translated_rollout_correction_reproduces_our_estimator(spec, estimator, level):
    """verl's rollout-correction step, configured by our overrides, gives our estimator's weight and
    mask (for MIS: weight rho*1[rho<=C] and the rejected sequences/tokens leave the mask)."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    from harness.estimators import build
    from harness.estimators.base import PolicyForward

    args = [f"estimator.level={level}"] if estimator != "icepop" else []
    cfg = spec(f"estimator={estimator}", MOE, *args)
    rc = translate.verl_config(cfg, check=False).algorithm.rollout_correction

    g = torch.Generator().manual_seed(0)
    B, R = 64, 12
    logp_roll = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3
    logp_rec = logp_roll + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.3
    mask = (torch.arange(R) < torch.randint(3, R + 1, (B, 1), generator=g)).to(torch.float64)
    batch = DataProto.from_dict(tensors={"old_log_probs": logp_rec, "rollout_log_probs": logp_roll,
                                         "response_mask": mask.clone()})
    out, metrics = compute_rollout_correction_and_add_to_batch(batch, rc)

    class Ctx:  # the local trainer's OldPolicyContext, on fixed tensors
        def __init__(self):
            self.logp_roll, self.mask, self.routed_experts = logp_roll, mask, None

        def recompute(self, replay=None):
            return PolicyForward(logp=logp_rec)

    old = build(cfg.estimator).old_policy(Ctx())
    torch.testing.assert_close(out.batch["rollout_is_weights"], old.weight * mask)
    torch.testing.assert_close(out.batch["response_mask"].to(torch.float64), old.mask)
    if estimator == "mis":
        assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1  # the test exercises masking


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mean_n_tis_is_verls_decoupled_rollout_is_over_the_mean_n_loops_log_probs(spec, level):
    """Decoupled mode (old_log_probs = the actor's recompute) + ``rollout_is`` + our ``harness_mean_n`` loop,
    whose rollout log-probs are the log-mean-exp of n re-scorings: verl's weight is our mean_n_tis weight."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    from harness.backends.verl.plugins.mean_n import mean_n_logprobs
    from harness.estimators import build
    from harness.estimators.base import PolicyForward

    cfg = spec("estimator=mean_n_tis", MOE, f"estimator.level={level}", "estimator.n=4")
    vc = translate.verl_config(cfg, check=False)
    rc = vc.algorithm.rollout_correction
    assert not rc.bypass_mode and rc.rollout_is == level and vc.harness.mean_n == 4
    assert vc.actor_rollout_ref.rollout.agent.default_agent_loop == "harness_mean_n"

    g = torch.Generator().manual_seed(1)
    B, R, n = 32, 10, 4
    scores = -torch.rand(n, B, R, generator=g, dtype=torch.float64) * 3  # the n vLLM re-scorings
    logp_rec = scores.exp().mean(0).log() + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.5
    mask = (torch.arange(R) < torch.randint(3, R + 1, (B, 1), generator=g)).to(torch.float64)
    rollout = torch.tensor([mean_n_logprobs(scores[:, b]) for b in range(B)], dtype=torch.float64)  # per response
    batch = DataProto.from_dict(tensors={"old_log_probs": logp_rec, "rollout_log_probs": rollout,
                                         "response_mask": mask.clone()})
    out, _ = compute_rollout_correction_and_add_to_batch(batch, rc)

    class Ctx:  # the local trainer's OldPolicyContext, on fixed tensors
        logp_roll, routed_experts = torch.zeros(B, R, dtype=torch.float64), None

        def __init__(self):
            self.mask = mask

        def recompute(self, replay=None):
            return PolicyForward(logp=logp_rec)

        def score(self, k):
            return scores[:k]

    old = build(cfg.estimator).old_policy(Ctx())
    torch.testing.assert_close(out.batch["rollout_is_weights"], old.weight * mask)
    assert (old.weight * mask).max() == 2.0 and (old.weight[mask > 0] < 2.0).any()  # the cap is exercised


def test_mis_and_icepop_thresholds_are_strings_after_composition(spec):
    for est in ("mis", "icepop"):
        rc = translate.verl_config(spec(f"estimator={est}", MOE), check=False).algorithm.rollout_correction
        assert isinstance(rc.rollout_is_threshold, str)
    rc = translate.verl_config(spec("estimator=mis", MOE, "estimator.clip_c=4"), check=False)
    rc = rc.algorithm.rollout_correction
    assert (rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold) == ("1e-9_4.0", "seq_sum_k1", "0.25_inf")


def test_hydra_values_round_trip_through_composition(spec):
    """Our value quoting: paths, floats, inf, lists, lookalike strings keep their type in verl's config."""
    cfg = spec("estimator=recompute", MOE, "trainer.max_grad_norm=null", "verl.dual_clip_c=3.0",
                    "verl.data.train_files='/data/my set/train-v1.parquet'")
    vc = translate.verl_config(cfg, check=False)
    assert vc.actor_rollout_ref.actor.optim.clip_grad == float("inf")
    assert vc.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert vc.data.train_files == "/data/my set/train-v1.parquet"
    assert vc.actor_rollout_ref.model.path == "Qwen/Qwen3-30B-A3B"
    assert translate.hydra_value("0.5_5.0") == '"0.5_5.0"' and translate.hydra_value("true") == '"true"'


def test_sampler_reaches_vllm_and_the_actor_uses_its_temperature(spec):
    """One temperature for both engines: verl's legacy trainer passes ``rollout.temperature`` to the actor
    (``meta_info["temperature"]``), which divides its logits by it; top-k / top-p reach vLLM only."""
    cfg = spec("estimator=tis", MOE, "inference.temperature=0.7", "inference.top_k=20", "inference.top_p=0.9",
               "inference.logprobs_mode=raw")
    r = translate.verl_config(cfg).actor_rollout_ref.rollout
    assert (r.temperature, r.top_k, r.top_p, r.logprobs_mode) == (0.7, 20, 0.9, "raw_logprobs")
    r = translate.verl_config(spec("estimator=tis", MOE)).actor_rollout_ref.rollout
    assert (r.temperature, r.top_k, r.top_p, r.logprobs_mode) == (1.0, -1, 1.0, "processed_logprobs")


def test_dual_clip_is_off_by_default_as_in_the_harness_loss(spec):
    a = translate.verl_config(spec("estimator=recompute", MOE), check=False).actor_rollout_ref.actor
    assert a.clip_ratio_c >= 1e29


def test_megatron_and_fsdp_parallelism_reach_verl(spec):
    vc = translate.verl_config(spec("estimator=r3", MOE), check=False)
    m = vc.actor_rollout_ref.actor.megatron
    assert vc.actor_rollout_ref.actor.strategy == "megatron"
    assert (m.tensor_model_parallel_size, m.expert_model_parallel_size) == (2, 8)
    assert vc.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    vc = translate.verl_config(spec("estimator=tis", DENSE), check=False)
    assert vc.actor_rollout_ref.actor.strategy == "fsdp2"
    assert vc.data.apply_chat_template_kwargs.enable_thinking is False


def test_generated_task_uses_our_reward_and_gsm8k_verls(spec):
    vc = translate.verl_config(spec("estimator=tis", MOE, "task=addition", "task.reward=exact"), check=False)
    fn = vc.reward.custom_reward_function
    assert fn.path == str(translate.REWARD_FILE) and fn.name == "compute_score" and fn.reward_kwargs.mode == "exact"
    assert vc.data.train_files.endswith("addition_L3/train.parquet")
    assert vc.harness.exact_reward is True


def test_gsm8k_preset_translates():
    """task=gsm8k_verl (harness/tasks/gsm8k.py: verl only, its rows scored by verl's rule reward)."""
    from harness.spec import build, compose

    from harness.backends.verl.config import validate

    raw = compose(["backend=verl", "model=qwen3_30b_a3b", "task=gsm8k_verl", "estimator=tis", "trainer.lr=1e-6",
                   "trainer.prompts_per_step=16", "trainer.num_minibatches=4"])
    cfg = build(raw)
    validate(cfg)
    vc = translate.verl_config(cfg, check=False)
    _verl_checks(vc)
    assert vc.data.train_files.endswith("gsm8k/train.parquet")
    assert vc.reward.custom_reward_function.path is None  # verl's rule reward by data_source
    assert vc.harness.exact_reward is True


def test_an_estimator_without_a_mapping_fails_closed(spec, monkeypatch):
    """rollout_correction() had no else-branch: an unmapped estimator trained as recompute. Now an estimator
    declaring ``verl = None`` is refused by the verl checks and by the translation (the toy estimator of
    tests/estimators/test_toy_estimator.py checks the command line end to end)."""
    from harness.backends.verl.config import validate as validate_verl
    from harness.estimators.recompute import Recompute

    unmapped = type("Unmapped", (Recompute,), {"name": "unmapped", "verl": None})
    monkeypatch.setitem(estimators.REGISTRY, "unmapped", unmapped)
    cfg = spec("estimator=recompute", MOE)
    cfg.estimator.name = "unmapped"
    for refuse in (validate_verl, translate.overrides, translate.environment):
        with pytest.raises(ConfigError, match="'unmapped' has no verl mapping") as exc:
            refuse(cfg)
        assert exc.value.key == "estimator"
    cfg.estimator.name = "not_registered"
    with pytest.raises(ConfigError, match="not_registered"):
        translate.overrides(cfg)
    assert MAPPED == list(estimators.NAMES)  # every shipped estimator is mapped today


def test_megatron_recompute_and_cpu_adam_reach_verls_engine_config(spec):
    """enable_gradient_checkpointing is an FSDP key (megatron ignores it); megatron's recompute lives in
    override_transformer_config, CPU Adam in override_optimizer_config (verl's megatron optimizer)."""
    from verl.utils.config import omega_conf_to_dataclass

    vc = translate.verl_config(spec("estimator=tis", MOE), check=False)
    a = vc.actor_rollout_ref.actor
    t = a.megatron.override_transformer_config
    assert (t.recompute_granularity, t.recompute_method, t.recompute_num_layers) == ("full", "uniform", 1)
    o = a.optim.override_optimizer_config
    assert o.optimizer_cpu_offload is True and o.optimizer_offload_fraction == 1.0
    assert vc.actor_rollout_ref.model.enable_gradient_checkpointing is False
    engine = omega_conf_to_dataclass(a.megatron)  # verl's McoreEngineConfig takes them
    assert engine.override_transformer_config["recompute_granularity"] == "full"
    # off: verl's defaults (recompute null, GPU Adam)
    vc = translate.verl_config(spec("estimator=tis", MOE, "verl.parallel.recompute=none",
                                    "verl.parallel.cpu_adam=false"), check=False)
    assert vc.actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity is None
    assert "optimizer_cpu_offload" not in vc.actor_rollout_ref.actor.optim.override_optimizer_config
    # FSDP: gradient checkpointing; cpu_adam is FSDP2's CPUOffloadPolicy
    vc = translate.verl_config(spec("estimator=rais", "model=qwen3_30b_a3b_fsdp", "verl.experimental_rais=true"),
                               check=False)
    assert vc.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert vc.actor_rollout_ref.actor.fsdp_config.offload_policy is True


def test_moe_router_runs_in_fp32_on_megatron_as_verls_own_recipe(spec):
    """MoE on megatron: override_transformer_config.moe_router_dtype=fp32 (verl's Qwen3-30B-A3B recipe), composed
    with verl's config and validated, reaching the actor's engine dataclass and the reference (oc.select); a dense
    model on megatron and any model on FSDP get no such key (FSDP has no per-module router precision)."""
    from verl.utils.config import omega_conf_to_dataclass

    vc = translate.verl_config(spec("estimator=tis", MOE))  # composed and through verl's validate_config
    a = vc.actor_rollout_ref.actor
    assert a.megatron.override_transformer_config.moe_router_dtype == "fp32"
    assert omega_conf_to_dataclass(a.megatron).override_transformer_config["moe_router_dtype"] == "fp32"
    assert vc.actor_rollout_ref.ref.megatron.override_transformer_config.moe_router_dtype == "fp32"
    dense = translate.verl_config(spec("estimator=tis", DENSE, "verl.strategy=megatron"), check=False)
    assert "moe_router_dtype" not in dense.actor_rollout_ref.actor.megatron.override_transformer_config
    fsdp = translate.overrides(spec("estimator=mis", MOE_FSDP))
    assert not [o for o in fsdp if "router_dtype" in o]
    # a raw override can still set another precision (the key exists once added)
    vc = translate.verl_config(spec("estimator=tis", MOE, "verl.extra_overrides=['actor_rollout_ref.actor.megatron."
                                    "override_transformer_config.moe_router_dtype=fp64']"), check=False)
    assert vc.actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype == "fp64"


def test_geo_rs_band_reaches_verl_inverted_and_float16_rollouts_compose(spec):
    """geo_rs's band [lower, upper] on the geometric-mean ratio g is verl's seq_mean_k1 threshold on exp(k1) = 1/g;
    inference.dtype=float16 is vLLM's rollout dtype (the fp16 arm), through verl's own validation."""
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_rs_thresholds

    vc = translate.verl_config(spec("estimator=geo_rs", MOE, "estimator.lower=0.5", "estimator.upper=1.25"))
    rc = vc.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_rs, rc.rollout_rs_threshold) == (None, "seq_mean_k1", "0.8_2.0")
    assert _parse_rollout_rs_thresholds(["seq_mean_k1"], rc.rollout_rs_threshold)["seq_mean_k1"] == {
        "lower": 0.8, "upper": 2.0}
    for dtype in ("float16", "bfloat16"):
        vc = translate.verl_config(spec("estimator=tis", MOE, f"inference.dtype={dtype}"))
        assert _verl_checks(vc)["rollout"].dtype == dtype


def test_r2_replays_megatrons_own_routes_in_any_update_geometry(spec):
    """r2 is Megatron's R2 whatever the minibatches (the replay is the point); with verl.routing_metrics too (the
    one-update rule of the routing metrics exists for the estimators that must not replay)."""
    for extra in ([], ["verl.routing_metrics=true"]):
        vc = translate.verl_config(spec("estimator=r2", MOE, *extra))
        _verl_checks(vc)
        assert vc.actor_rollout_ref.actor.megatron.router_replay.mode == "R2"
        assert vc.algorithm.rollout_correction.bypass_mode is False  # verl's R2 records in the old-log-prob pass
