"""A harness spec -> the ``python -m verl.trainer.main_ppo`` Hydra overrides that run it.

Every key below is a key of verl 0.9.1's own ``trainer/config/ppo_trainer.yaml`` (plus the
``model_engine=megatron`` group switch); ``tests/backends/verl`` composes each estimator's list
with that file through Hydra and runs verl's config validation on it, so a typo fails a test.

Estimator mapping (docs/design.md section 8): each estimator declares its own, in its module under
``harness/estimators/`` (``verl``: bypass mode, the ``rollout_correction`` fields, agent loop, policy
loss, environment, checks); ``needs.replay`` turns on Megatron's router replay (R3) and
``needs.deterministic`` vLLM's full determinism with our seeded agent loop ``harness_deterministic``
(plugins/deterministic.py: a seed and request id per sample, so a GRPO group's responses differ and every
call is reproducible). An estimator declaring ``verl=None`` is refused (ConfigError, exit 2,
``config.estimator_mapping``): it never trains as recompute.

The trainer is verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=false``, config.TRAINERS): the
one whose loss denominator drops MIS-rejected tokens, as the harness does.

Our code reaches verl's Ray workers through ``VERL_USE_EXTERNAL_MODULES`` (read by
``verl/__init__.py`` in every process that imports verl), set both in the launching environment
and in Ray's ``runtime_env``.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from harness import estimators, tasks
from harness.backends.verl.config import TOOL_FILES, estimator_mapping
from harness.backends.verl.routing import ROUTING_ENV
from harness.spec import RunConfig
from harness.overrides import hydra_value
from harness.tags import tag_values
from harness.uri import ROOT, home, mlflow_uri

PLUGIN_MODULE = "harness.backends.verl.plugins"
DETERMINISTIC_AGENT_LOOP = "harness_deterministic"
TOOL_AGENT_LOOP = "tool_agent"  # verl's multi-turn loop (experimental/agent_loop/tool_agent_loop.py)
ENTRYPOINT = ("-m", "verl.trainer.main_ppo")
REWARD_FILE = Path(__file__).with_name("reward.py")
CHECKPOINT_DIR = "verl_checkpoints"
#: Megatron's router precision for MoE models (``override_transformer_config``), as verl's own Qwen3-30B-A3B recipe
#: sets it (examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh); FSDP has no per-module counterpart
#: (its ``mixed_precision`` applies to every parameter): docs/verl.md, "The router's precision"
MOE_ROUTER_DTYPE = ("moe_router_dtype", "fp32")


SCRATCH_ENV = "SCRATCH"  # the cluster's scratch filesystem (shared by the nodes, not backed up), where sites set it
SCRATCH_SUBDIR = "moe-rl-harness/verl_checkpoints"


def checkpoint_root(cfg: RunConfig, env: dict | None = None) -> Path:
    """verl's ``trainer.default_local_dir``: ``<verl.checkpoint_dir>/<experiment>/<signature>`` when set; null:
    ``$SCRATCH/moe-rl-harness/verl_checkpoints/<experiment>/<signature>`` where ``$SCRATCH`` is an absolute path,
    else ``<run_dir>/verl_checkpoints``. ``$TMPDIR`` is never the default: it is node-local and often emptied at the
    job's end, so a requeued job (on other nodes) could not resume (docs/verl.md, "Checkpoints and the time limit")."""
    if cfg.verl.checkpoint_dir:
        return Path(cfg.verl.checkpoint_dir) / cfg.tracking.experiment / cfg.signature
    scratch = (os.environ if env is None else env).get(SCRATCH_ENV, "")
    if scratch and os.path.isabs(scratch):
        return Path(scratch) / SCRATCH_SUBDIR / cfg.tracking.experiment / cfg.signature
    return cfg.run_dir / CHECKPOINT_DIR


def _kv(items: list[tuple[str, Any]]) -> list[str]:
    return [f"{k}={hydra_value(v)}" for k, v in items]


# --------------------------------------------------------------------------------- sections
def _params(cfg: RunConfig):
    return cfg.estimator.params


def rollout_correction(cfg: RunConfig) -> dict[str, Any]:
    """``algorithm.rollout_correction`` for the estimator (verl's RolloutCorrectionConfig fields)."""
    mapping = estimator_mapping(cfg)
    rc: dict[str, Any] = {"bypass_mode": mapping.bypass, "loss_type": "ppo_clip", "rollout_is": None,
                          "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False,
                          "rollout_rs": None, "rollout_rs_threshold": None}
    if mapping.correction is not None:
        rc.update(mapping.correction(_params(cfg)))
    return rc


def agent_loop(cfg: RunConfig) -> str:
    """The rollout's agent loop: the estimator's own (mean_n's re-scoring loop), our seeded loop under full
    determinism (verl's own gives every sample the same seed), else verl's ``single_turn_agent``. With
    ``verl.tools`` (multi-turn): the estimator's own multi-turn loop, else verl's ``tool_agent`` (config.validate
    refused the estimators that have neither)."""
    mapping = estimator_mapping(cfg)
    if cfg.verl.tools is not None:
        return mapping.tool_agent_loop or TOOL_AGENT_LOOP
    own = mapping.agent_loop
    if own:
        return own
    if estimators.get(cfg.estimator.name).needs.deterministic or cfg.inference.deterministic:
        return DETERMINISTIC_AGENT_LOOP
    return "single_turn_agent"


def data_dir(cfg: RunConfig) -> Path:
    """Folder of the task's prepared parquet files (``python -m harness.backends.verl.data``)."""
    root = Path(cfg.verl.data.root)
    root = root if root.is_absolute() else home() / root  # the project root in a checkout (harness.uri.home)
    return root / tasks.get(cfg.task.name).data_dir(cfg.task.length)


def tools_file(cfg: RunConfig) -> str | None:
    """``verl.tools`` as an absolute path (relative ones are relative to the project root), or None."""
    tools = cfg.verl.tools
    if tools is None:
        return None
    return str(Path(tools) if Path(tools).is_absolute() else ROOT / tools)


def multi_turn(cfg: RunConfig) -> list[tuple[str, Any]]:
    """``rollout.multi_turn`` keys of a spec with ``verl.tools`` (none without: single-turn, verl's defaults)."""
    path = tools_file(cfg)
    if path is None:
        return []
    R = "actor_rollout_ref.rollout.multi_turn"
    return [(f"{R}.enable", True), (f"{R}.{TOOL_FILES[Path(path).suffix]}", path)]


def data_files(cfg: RunConfig) -> tuple[str, str]:
    d = cfg.verl.data
    base = data_dir(cfg)
    return d.train_files or str(base / "train.parquet"), d.val_files or str(base / "test.parquet")


def run_name(cfg: RunConfig) -> str:
    e = cfg.estimator
    knob = "".join(f"-{k}{v:g}" for k, v in (("n", e.n), ("C", e.clip_c)) if v is not None)
    return cfg.tracking.run_name or f"{e.name}{knob}-s{cfg.seed}-{cfg.signature}"


def environment(cfg: RunConfig) -> dict[str, str]:
    """Environment of the driver (``main_ppo``); the same reaches every Ray worker via runtime_env."""
    # an http store's credentials: in MLFLOW_TRACKING_USERNAME/PASSWORD of this process, inherited (harness.uri)
    env = {"VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE, "MLFLOW_TRACKING_URI": mlflow_uri(cfg.tracking_uri)}
    if cfg.verl.routing_metrics:  # plugins/routing.py wraps the trainer's old-log-prob pass
        env[ROUTING_ENV] = "1"
    mapping = estimator_mapping(cfg)
    if mapping.env is not None:
        env.update(mapping.env(_params(cfg)))
    return env


A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
Items = list[tuple[str, Any]]


def _algorithm(cfg: RunConfig) -> Items:
    """GRPO, no KL (the harness's loss has none), the estimator's rollout correction."""
    out: Items = [("algorithm.adv_estimator", "grpo"), ("algorithm.norm_adv_by_std_in_grpo", True),
                  ("algorithm.use_kl_in_reward", False)]
    return out + [(f"algorithm.rollout_correction.{k}", val) for k, val in rollout_correction(cfg).items()]


def _data(cfg: RunConfig) -> Items:
    """The parquet files, batch and lengths, the data seed and the chat template's arguments."""
    d, tr = cfg.verl.data, cfg.trainer
    train_files, val_files = data_files(cfg)
    out: Items = [("data.train_files", train_files), ("data.val_files", val_files),
                  ("data.train_batch_size", tr.prompts_per_step), ("data.max_prompt_length", d.max_prompt_length),
                  ("data.max_response_length", d.max_response_length), ("data.filter_overlong_prompts", True),
                  ("data.truncation", "error"), ("data.seed", cfg.seed)]
    return out + [(f"++data.apply_chat_template_kwargs.{k}", val) for k, val in cfg.verl.chat_template_kwargs.items()]


def _model(cfg: RunConfig) -> Items:
    """The checkpoint; ``enable_gradient_checkpointing`` is read by the FSDP engine only (megatron's recompute is
    in ``_megatron``)."""
    p, megatron = cfg.verl.parallel, cfg.verl.strategy == "megatron"
    return [("actor_rollout_ref.model.path", cfg.model.path),
            ("actor_rollout_ref.model.use_remove_padding", p.use_remove_padding),
            ("actor_rollout_ref.model.enable_gradient_checkpointing", p.gradient_checkpointing and not megatron)]


def _actor(cfg: RunConfig) -> Items:
    """The actor (training engine): its batch sizes, PPO loss, optimizer and seed."""
    tr, v, p = cfg.trainer, cfg.verl, cfg.verl.parallel
    bsz = [(f"{A}.ppo_micro_batch_size_per_gpu", p.micro_batch_per_gpu), (f"{A}.use_dynamic_bsz", p.use_dynamic_bsz),
           (f"{A}.ppo_max_token_len_per_gpu", p.max_token_len_per_gpu)]
    return [(f"{A}.ppo_mini_batch_size", tr.prompts_per_step // tr.num_minibatches), *bsz,
            (f"{A}.ppo_epochs", tr.ppo_epochs), (f"{A}.clip_ratio", tr.clip_eps),
            (f"{A}.clip_ratio_low", tr.clip_eps), (f"{A}.clip_ratio_high", tr.clip_eps),
            (f"{A}.clip_ratio_c", float(v.dual_clip_c) if v.dual_clip_c is not None else 1.0e30),
            (f"{A}.loss_agg_mode", "token-mean"), (f"{A}.entropy_coeff", tr.entropy_coef),
            (f"{A}.use_kl_loss", False), (f"{A}.optim.lr", tr.lr), (f"{A}.optim.weight_decay", tr.weight_decay),
            (f"{A}.optim.clip_grad", float(tr.max_grad_norm) if tr.max_grad_norm is not None else math.inf),
            (f"{A}.data_loader_seed", cfg.seed),
            (f"{A}.policy_loss.loss_mode", estimator_mapping(cfg).loss_mode)]


def router_replay_mode(cfg: RunConfig) -> str:
    """Megatron's ``router_replay.mode``: R3 (replay the rollout's routing) for an estimator that needs it, R2
    (record the training routes in the old-log-prob pass, replay them in the update) for an estimator whose mapping
    asks for it (r2) or with ``verl.routing_metrics``, else disabled."""
    if estimators.get(cfg.estimator.name).needs.replay:
        return "R3"
    own = estimator_mapping(cfg).router_replay
    if own is not None:
        return own
    return "R2" if cfg.verl.routing_metrics else "disabled"


def _megatron(cfg: RunConfig) -> Items:
    """Megatron's parallelism, offload, router replay (R3), activation recompute and CPU Adam."""
    p = cfg.verl.parallel
    M = f"{A}.megatron"
    out: Items = [(f"{M}.tensor_model_parallel_size", p.tp), (f"{M}.pipeline_model_parallel_size", p.pp),
                  (f"{M}.context_parallel_size", p.cp), (f"{M}.expert_model_parallel_size", p.ep),
                  (f"{M}.expert_tensor_parallel_size", p.etp), (f"{M}.param_offload", p.param_offload),
                  (f"{M}.optimizer_offload", p.optimizer_offload), (f"{M}.seed", cfg.seed),
                  (f"{M}.router_replay.mode", router_replay_mode(cfg))]
    T = f"{M}.override_transformer_config"
    if cfg.model.kind == "moe":  # the router in fp32 (not in verl's yaml: added), as verl's own Qwen3-30B-A3B recipe
        out += [(f"+{T}.{MOE_ROUTER_DTYPE[0]}", MOE_ROUTER_DTYPE[1])]
    if p.recompute == "full":
        out += [(f"{T}.recompute_granularity", "full"), (f"{T}.recompute_method", "uniform"),
                (f"{T}.recompute_num_layers", p.recompute_num_layers)]
    elif p.recompute == "selective":
        out += [(f"{T}.recompute_granularity", "selective")]
    if p.cpu_adam:  # Megatron's HybridDeviceOptimizer: Adam states and step on the CPU
        O = f"+{A}.optim.override_optimizer_config"
        out += [(f"{O}.optimizer_cpu_offload", True), (f"{O}.optimizer_offload_fraction", 1.0),
                (f"{O}.overlap_cpu_optimizer_d2h_h2d", True), (f"{O}.use_precision_aware_optimizer", True)]
    return out


def _fsdp(cfg: RunConfig) -> Items:
    """FSDP's strategy (fsdp | fsdp2), offload (``offload_policy``: FSDP2's CPU Adam) and seed."""
    v, p = cfg.verl, cfg.verl.parallel
    F = f"{A}.fsdp_config"
    return [(f"{A}.strategy", v.strategy), (f"{F}.param_offload", p.param_offload),
            (f"{F}.optimizer_offload", p.optimizer_offload), (f"{F}.offload_policy", p.cpu_adam),
            (f"{F}.seed", cfg.seed)]


def _engine(cfg: RunConfig) -> Items:
    """The training engine's section: ``_megatron`` or ``_fsdp``."""
    return _megatron(cfg) if cfg.verl.strategy == "megatron" else _fsdp(cfg)


def _rollout(cfg: RunConfig) -> Items:
    """vLLM: sampler, log-prob semantics, determinism, routing capture, agent loop, multi-turn tools."""
    i, tr, v, p = cfg.inference, cfg.trainer, cfg.verl, cfg.verl.parallel
    needs = estimators.get(cfg.estimator.name).needs
    deterministic = i.deterministic or needs.deterministic
    out: Items = [(f"{R}.name", v.rollout), (f"{R}.n", tr.group_size), (f"{R}.temperature", i.temperature),
                  (f"{R}.top_k", i.top_k if i.top_k > 0 else -1), (f"{R}.top_p", i.top_p),
                  (f"{R}.logprobs_mode", "processed_logprobs" if i.logprobs_mode == "processed" else "raw_logprobs"),
                  (f"{R}.calculate_log_probs", True), (f"{R}.dtype", i.dtype),
                  (f"{R}.tensor_model_parallel_size", p.rollout_tp), (f"{R}.expert_parallel_size", p.rollout_ep),
                  (f"{R}.gpu_memory_utilization", p.gpu_memory_utilization),
                  (f"{R}.log_prob_micro_batch_size_per_gpu", p.micro_batch_per_gpu),
                  (f"{R}.full_determinism", deterministic), (f"{R}.seed", cfg.seed),
                  (f"{R}.enable_rollout_routing_replay", needs.replay or v.routing_metrics),
                  (f"{R}.agent.default_agent_loop", agent_loop(cfg))]
    return out + multi_turn(cfg)


def _reward(cfg: RunConfig) -> Items:
    """Ours for tasks with a text reward (the generated ones) or ``verl.data.reward``, else none: verl's rule
    reward by data_source (gsm8k)."""
    d, t = cfg.verl.data, cfg.task
    if d.reward is not None:
        path, _, fn = d.reward.partition(":")
        path = str(Path(path) if Path(path).is_absolute() else ROOT / path)
        return [("reward.custom_reward_function.path", path), ("reward.custom_reward_function.name", fn)]
    if tasks.get(t.name).text_reward is not None:
        return [("reward.custom_reward_function.path", str(REWARD_FILE)),
                ("reward.custom_reward_function.name", "compute_score"),
                ("+reward.custom_reward_function.reward_kwargs.mode", t.reward)]
    return []


def _trainer(cfg: RunConfig) -> Items:
    """Cluster shape, steps, checkpoints (resume_mode=auto: a requeued job resumes), validation, tracking."""
    v, tr = cfg.verl, cfg.trainer
    return [("trainer.use_v1", v.trainer != "legacy"), ("trainer.logger", ["console", "mlflow"]),
            ("trainer.project_name", cfg.tracking.experiment),
            ("trainer.experiment_name", run_name(cfg)), ("trainer.nnodes", v.nnodes),
            ("trainer.n_gpus_per_node", v.gpus_per_node), ("trainer.total_training_steps", tr.steps),
            ("trainer.total_epochs", 100000), ("trainer.critic_warmup", 0),
            ("trainer.save_freq", tr.checkpoint_every if tr.checkpoint_every > 0 else -1),
            ("trainer.max_actor_ckpt_to_keep", 1), ("trainer.resume_mode", "auto"),
            ("trainer.default_local_dir", str(checkpoint_root(cfg))),
            ("trainer.test_freq", v.val_every if v.val_every > 0 else -1), ("trainer.val_before_train", v.val_every > 0)]


def _harness(cfg: RunConfig, commit: str | None, env: dict[str, str] | None) -> Items:
    """Our block (read by the plugins: MLflow tags, mean_n's n) and the workers' environment (Ray runtime_env)."""
    e, t, mapping = cfg.estimator, cfg.task, estimator_mapping(cfg)
    exact = "partial" not in tasks.get(t.name).rewards or t.reward == "exact"
    out: Items = [("+harness.estimator", e.name), ("+harness.signature", cfg.signature),
                  ("+harness.exact_reward", exact)]
    if mapping.harness is not None:
        out += [(f"+harness.{k}", val) for k, val in mapping.harness(_params(cfg)).items()]
    out += [(f"+harness.tags.{k}", val) for k, val in tag_values(cfg, commit).items()]
    for k, val in sorted((env if env is not None else environment(cfg)).items()):
        out.append((f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}", str(val)))
    return out


#: the sections of the override list, in its order (then ``_harness``, the model_engine switch and extra_overrides)
SECTIONS = (_algorithm, _data, _model, _actor, _engine, _rollout, _reward, _trainer)


def overrides(cfg: RunConfig, commit: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """The override list for ``python -m verl.trainer.main_ppo``: every section of ``SECTIONS`` in order, our
    ``+harness`` block, ``model_engine=megatron`` first on megatron, ``verl.extra_overrides`` last."""
    estimator_mapping(cfg)  # refuse an unmapped estimator before anything else
    out: Items = [item for section in SECTIONS for item in section(cfg)]
    items = _kv(out + _harness(cfg, commit, env))
    if cfg.verl.strategy == "megatron":
        items.insert(0, "model_engine=megatron")
    return items + list(cfg.verl.extra_overrides)


def command(cfg: RunConfig, commit: str | None = None, python: str | None = None,
            env: dict[str, str] | None = None) -> list[str]:
    """``env K=V ... python -m verl.trainer.main_ppo OVERRIDE ...`` as an argv list (shlex.join to paste)."""
    env = environment(cfg) if env is None else env
    prefix = ["env", *(f"{k}={val}" for k, val in sorted(env.items()))]
    return [*prefix, python or sys.executable, *ENTRYPOINT, *overrides(cfg, commit, env)]


def verl_config(cfg: RunConfig, commit: str | None = None, check: bool = True):
    """The config ``main_ppo`` would run: our overrides composed with the installed verl's own
    ``ppo_trainer.yaml`` (Hydra compose API), then verl's pre-flight ``validate_config``.

    Needs verl importable (not vLLM, not a GPU); a launcher can call it before submitting a job."""
    from pathlib import Path as _Path

    import verl
    from hydra import compose, initialize_config_dir

    config_dir = _Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        vc = compose(config_name="ppo_trainer", overrides=overrides(cfg, commit))
    if check:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        validate_config(config=vc, use_reference_policy=need_reference_policy(vc), use_critic=need_critic(vc))
    return vc
