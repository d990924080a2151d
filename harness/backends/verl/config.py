"""Typed knobs of the verl backend (``RunConfig.verl``) and its checks.

Everything else a verl run needs comes from the shared spec (estimator, model, task, trainer,
inference, tracking): ``translate.py`` maps it onto verl's ``ppo_trainer.yaml``. This section only
holds what has no counterpart there: the training strategy and parallelism (set by the model
presets in ``experiments/model/``), the cluster shape, the data files (task presets) and a few
verl-only switches.

``validate(cfg)`` is called by ``harness.spec.validate`` when ``backend.name == "verl"``. Every
combination that verl cannot run (an estimator without a verl mapping, R3 on FSDP, a model without a
checkpoint, sampler settings that make mean_n's re-scoring biased, ...) raises
:class:`harness.errors.ConfigError` here, before any job is submitted; the estimator-specific checks are
declared by each estimator (``harness.estimators``, its ``verl.check``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends.verl_section import VerlArchConfig, VerlConfig, VerlDataConfig, VerlParallelConfig  # noqa: F401
from harness.errors import ConfigError
from harness.errors import one_of as _one_of, require as _require

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig
    from harness.estimators import Verl

STRATEGIES = ("fsdp", "fsdp2", "megatron")
ROLLOUT_ENGINES = ("vllm",)
KEEP_CHECKPOINT = ("none", "hf", "last")  # verl.keep_checkpoint (retention.py)
#: verl 0.9.1 has two trainers (``trainer.use_v1``): the legacy ``ray_trainer.RayPPOTrainer`` and the
#: V1 TransferQueue trainer (its default). Only the legacy one is supported: under V1 the token-mean
#: denominator keeps the tokens that rejection sampling masked (``loss_mask`` is stored once at
#: rollout, only ``response_mask`` is updated), which is not the harness's MIS (docs/verl.md).
TRAINERS = ("legacy",)
#: Megatron activation recompute (``override_transformer_config.recompute_granularity``)
RECOMPUTE = ("none", "selective", "full")
#: learning rates above this are the local backend's defaults leaking into an LLM run
MAX_LLM_LR = 1e-4
#: ``verl.tools`` by suffix -> verl's ``rollout.multi_turn`` key that loads it
TOOL_FILES = {".py": "function_tool_path", ".yaml": "tool_config_path", ".yml": "tool_config_path"}


def estimator_mapping(cfg: "RunConfig") -> "Verl":
    """The run's estimator's verl mapping (``harness.estimators``, its ``verl``); an estimator without one
    is refused (ConfigError naming it): it would otherwise train as recompute under its own name."""
    from harness import estimators

    estimator = estimators.REGISTRY.get(cfg.estimator.name)
    mapping = estimator.verl if estimator is not None else None
    if mapping is None:
        mapped = [n for n in estimators.NAMES if estimators.get(n).verl is not None]
        raise ConfigError("estimator", f"{cfg.estimator.name!r} has no verl mapping (its module in "
                          f"harness/estimators/ declares verl=None; mapped: {', '.join(mapped)}); refusing rather "
                          "than training it as recompute")
    return mapping


def _check_tools(cfg: "RunConfig") -> None:
    """``verl.tools``: a tool file verl can load, and an estimator whose rollout can be multi-turn."""
    from harness import estimators

    tools, e = cfg.verl.tools, cfg.estimator
    _require(Path(tools).suffix in TOOL_FILES, "verl.tools",
             f"must be a .py file of verl @function_tool functions or a .yaml verl tool config, got {tools!r}")
    mapping = estimator_mapping(cfg)
    _require(not mapping.agent_loop or mapping.tool_agent_loop is not None, "verl.tools",
             f"estimator {e.name} samples with its own agent loop {mapping.agent_loop!r}, which has no multi-turn "
             "variant (its Verl mapping declares no tool_agent_loop); it cannot run with tools")
    _require(not (estimators.get(e.name).needs.deterministic or cfg.inference.deterministic), "verl.tools",
             "deterministic rollouts need our seeded single-turn loop (harness_deterministic); under full "
             "determinism verl's tool loop gives every sample of a group the same seed and request id")


# --------------------------------------------------------------------------------- sections
def _engine(cfg: "RunConfig") -> None:
    """The engine switches: strategy, trainer, recompute, checkpoint folder, GPU memory, rollout engine."""
    v, p = cfg.verl, cfg.verl.parallel
    _one_of(v.strategy, STRATEGIES, "verl.strategy")
    _require(v.trainer in TRAINERS, "verl.trainer",
             f"unknown value {v.trainer!r}; allowed: {', '.join(TRAINERS)}. verl's V1 TransferQueue trainer "
             "keeps MIS-rejected tokens in the token-mean denominator and needs the TransferQueue package "
             "(docs/verl.md, 'Which trainer')")
    _one_of(p.recompute, RECOMPUTE, "verl.parallel.recompute")
    _require(p.recompute_num_layers >= 1, "verl.parallel.recompute_num_layers",
             f"must be >= 1, got {p.recompute_num_layers}")
    _require(v.checkpoint_dir is None or (isinstance(v.checkpoint_dir, str) and Path(v.checkpoint_dir).is_absolute()),
             "verl.checkpoint_dir", f"must be an absolute folder (e.g. verl.checkpoint_dir=/scratch/$USER/ckpt) "
             f"or null ($SCRATCH/moe-rl-harness/verl_checkpoints, else <run_dir>/verl_checkpoints), got "
             f"{v.checkpoint_dir!r}")
    _one_of(v.keep_checkpoint, KEEP_CHECKPOINT, "verl.keep_checkpoint")
    _require(v.gpu_memory_gb > 0, "verl.gpu_memory_gb", f"must be > 0, got {v.gpu_memory_gb}")
    _one_of(v.rollout, ROLLOUT_ENGINES, "verl.rollout")


def _estimator(cfg: "RunConfig") -> None:
    """The estimator: mapped (else refused), and its own verl-only checks."""
    mapping = estimator_mapping(cfg)
    if mapping.check is not None:
        mapping.check(cfg)


def n_gpus(cfg: "RunConfig") -> int:
    """GPUs of the whole job: ``verl.nnodes * verl.gpus_per_node``."""
    return cfg.verl.nnodes * cfg.verl.gpus_per_node


def _sizes(cfg: "RunConfig") -> None:
    """Node, GPU, parallel and micro-batch sizes are >= 1; vLLM's memory share is in (0, 1)."""
    v, p = cfg.verl, cfg.verl.parallel
    for key in ("nnodes", "gpus_per_node"):
        _require(getattr(v, key) >= 1, f"verl.{key}", f"must be >= 1, got {getattr(v, key)}")
    for key in ("tp", "pp", "cp", "ep", "micro_batch_per_gpu", "max_token_len_per_gpu", "rollout_tp", "rollout_ep"):
        _require(getattr(p, key) >= 1, f"verl.parallel.{key}", f"must be >= 1, got {getattr(p, key)}")
    if p.etp is not None:
        _require(p.etp >= 1, "verl.parallel.etp", f"must be >= 1 or null, got {p.etp}")
    _require(0 < p.gpu_memory_utilization < 1, "verl.parallel.gpu_memory_utilization",
             f"must be in (0, 1), got {p.gpu_memory_utilization}")


def _training_parallelism(cfg: "RunConfig") -> None:
    """Megatron: model and expert parallelism divide the GPUs. FSDP: no model parallelism, no megatron
    recompute, cpu_adam only on FSDP2."""
    v, p, gpus = cfg.verl, cfg.verl.parallel, n_gpus(cfg)
    if v.strategy == "megatron":
        mp = p.tp * p.pp * p.cp
        _require(gpus % mp == 0, "verl.parallel.tp",
                 f"tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {mp} must divide the {gpus} GPUs")
        _require(gpus % p.ep == 0, "verl.parallel.ep",
                 f"expert parallel {p.ep} must divide the {gpus} GPUs")
        return
    for key in ("tp", "pp", "cp", "ep"):
        _require(getattr(p, key) == 1, f"verl.parallel.{key}",
                 f"model parallelism is a megatron setting; with verl.strategy={v.strategy} it must be 1")
    _require(p.recompute == "none", "verl.parallel.recompute",
             f"recompute is a megatron setting; with verl.strategy={v.strategy} use "
             "verl.parallel.gradient_checkpointing")
    _require(not p.cpu_adam or v.strategy == "fsdp2", "verl.parallel.cpu_adam",
             "cpu_adam on FSDP is FSDP2's CPUOffloadPolicy (fsdp_config.offload_policy): use verl.strategy=fsdp2")


def _rollout_parallelism(cfg: "RunConfig") -> None:
    """A vLLM replica's tensor parallel divides the GPUs and fits a whole number of nodes."""
    v, p, gpus = cfg.verl, cfg.verl.parallel, n_gpus(cfg)
    _require(gpus % p.rollout_tp == 0 and p.rollout_tp <= gpus, "verl.parallel.rollout_tp",
             f"vLLM tensor parallel {p.rollout_tp} must divide the {gpus} GPUs")
    _require(v.gpus_per_node % p.rollout_tp == 0 or p.rollout_tp % v.gpus_per_node == 0, "verl.parallel.rollout_tp",
             f"a vLLM replica of tp={p.rollout_tp} must fit a whole number of {v.gpus_per_node}-GPU nodes")


def _switches(cfg: "RunConfig") -> None:
    """The verl-only switches: dual clip, validation period, raw overrides, chat-template arguments."""
    v = cfg.verl
    if v.dual_clip_c is not None:
        _require(v.dual_clip_c > 1, "verl.dual_clip_c", f"must be > 1 or null (off), got {v.dual_clip_c}")
    _require(v.val_every >= 0, "verl.val_every", f"must be >= 0, got {v.val_every}")
    _require(isinstance(v.extra_overrides, list) and all(isinstance(x, str) and "=" in x for x in v.extra_overrides),
             "verl.extra_overrides", "must be a list of 'key=value' strings")
    _require(isinstance(v.chat_template_kwargs, dict), "verl.chat_template_kwargs", "must be a mapping")


def _data(cfg: "RunConfig") -> None:
    """Prompt and response lengths, the tool file (``_check_tools``) and a custom reward's ``file.py:function``."""
    v, d = cfg.verl, cfg.verl.data
    _require(d.max_prompt_length >= 1 and d.max_response_length >= 1, "verl.data.max_response_length",
             "prompt and response lengths must be >= 1")
    if v.tools is not None:
        _check_tools(cfg)
    if d.reward is not None:
        _require(d.reward.count(":") == 1 and d.reward.split(":")[0].endswith(".py"), "verl.data.reward",
                 f"must be 'path/to/file.py:function', got {d.reward!r}")


def _model_and_task(cfg: "RunConfig") -> None:
    """verl trains a Hugging Face checkpoint (``model.path``), on a task that declares the verl backend."""
    from harness import tasks

    m, t = cfg.model, cfg.task
    _require(bool(m.path), "model.path",
             f"model {m.name} has no checkpoint (model.path is null); the verl backend trains a Hugging Face "
             "model: pick a preset with a path (e.g. model=qwen3_30b_a3b or model=qwen3_4b) or set model.path")
    # tasks that declare the verl backend (harness/tasks/): gsm8k (verl's rule reward), and the harness's own
    # generated tasks rendered as text prompts with a rule reward (harness/backends/verl/reward.py)
    allowed = tasks.names("verl")
    _require(t.name in allowed, "task", f"the verl backend has no data for task {t.name!r}; allowed: {', '.join(allowed)}")


def _inference(cfg: "RunConfig") -> None:
    """The local engine's perturbation and prefix-cache knobs stay off; vLLM's batch variance and dtype."""
    from harness import estimators

    i = cfg.inference
    for key, off in (("router_noise_sigma", 0.0), ("logit_noise_sigma", 0.0), ("bias_delta", 1.0), ("kl_target", 0.0)):
        _require(getattr(i, key) == off, f"inference.{key}",
                 f"controlled perturbations exist only in the local inference engine; on verl it must stay {off}")
    for key, off in (("prefix_cache_capacity", 1.0), ("replay_on_miss", "recompute")):
        _require(getattr(i, key) == off, f"inference.{key}",
                 f"the prefix-cache capacity is simulated only by the local inference engine (vLLM sizes its own "
                 f"cache); on verl it must stay {off}")
    needs = estimators.get(cfg.estimator.name).needs
    _require(i.batch_variance or i.deterministic or needs.deterministic, "inference.batch_variance",
             "vLLM is batch-invariant only in full-determinism mode: set inference.deterministic=true "
             "(or leave batch_variance true)")
    _require(i.dtype in ("bfloat16", "float16"), "inference.dtype",
             f"vLLM rollouts on verl run in bfloat16 or float16, got {i.dtype}")


def _trainer(cfg: "RunConfig") -> None:
    """No overlap (unmapped); the trainer's batch geometry fits verl's mini-batches and GPUs; an LLM's lr."""
    v, tr = cfg.verl, cfg.trainer
    _require(not tr.overlap, "trainer.overlap",
             "one-step-off overlap is the local backend's (harness/backends/local/overlap.py); on verl it is not "
             "mapped yet (verl's own one-step-off recipe), so a run with it would silently train synchronously")
    _require(tr.prompts_per_step % tr.num_minibatches == 0, "trainer.num_minibatches",
             f"verl splits the {tr.prompts_per_step} prompts of a step into mini-batches of whole prompt groups: "
             f"num_minibatches={tr.num_minibatches} must divide prompts_per_step")
    seqs, gpus = tr.prompts_per_step * tr.group_size, n_gpus(cfg)
    if v.strategy != "megatron" and not v.parallel.use_dynamic_bsz:
        _require(seqs % gpus == 0, "trainer.prompts_per_step",
                 f"prompts_per_step*group_size = {seqs} sequences must split evenly over {gpus} GPUs")
    _require(tr.lr <= MAX_LLM_LR, "trainer.lr",
             f"{tr.lr} is a learning rate for the tiny local model; for an LLM on verl use e.g. trainer.lr=1e-6 "
             f"(limit {MAX_LLM_LR})")


def _routing_metrics(cfg: "RunConfig") -> None:
    """``verl.routing_metrics``: verl records training routes (R2) on megatron only, for a MoE model, in the
    old-log-prob pass (none in bypass mode; R3 replays the rollout's); R2 replays them in the update, which is the
    routing the update computes itself only when it runs once on the pre-update weights (unless the estimator asks
    for that replay: r2)."""
    from harness import estimators

    v, e, tr, key = cfg.verl, cfg.estimator, cfg.trainer, "verl.routing_metrics"
    if not v.routing_metrics:
        return
    _require(v.strategy == "megatron" and cfg.model.kind == "moe", key,
             f"needs a MoE model on verl.strategy=megatron (verl records training routes there only), got "
             f"{cfg.model.kind} on {v.strategy}")
    _require(not estimators.get(e.name).needs.replay and not estimator_mapping(cfg).bypass, key,
             f"estimator {e.name} has no training routes to compare: r3 replays the rollout's, a bypass estimator "
             "skips the old-log-prob pass (verl refuses R2 in bypass mode)")
    _require(estimator_mapping(cfg).router_replay == "R2" or (tr.num_minibatches == 1 and tr.ppo_epochs == 1), key,
             "R2 replays the old-log-prob pass's routing in the update: set trainer.num_minibatches=1 and "
             f"trainer.ppo_epochs=1 (got {tr.num_minibatches}, {tr.ppo_epochs}) so that it is the update's own")


#: the checks in the order they run: the first failing key is the one reported
CHECKS = (_engine, _estimator, _sizes, _training_parallelism, _rollout_parallelism, _switches, _data,
          _model_and_task, _inference, _trainer, _routing_metrics)


def validate(cfg: "RunConfig") -> "RunConfig":
    """Checks of a ``backend=verl`` spec that verl itself would only make on the cluster (or never): every check
    of ``CHECKS``, in order; ``cfg`` itself when all pass."""
    for check in CHECKS:
        check(cfg)
    return cfg
