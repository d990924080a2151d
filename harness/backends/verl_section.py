"""The verl backend's section of the spec (``RunConfig.verl``): its typed knobs and their defaults.

Declared here, beside the backend registry and outside the ``harness.backends.verl`` package, so that loading the
spec (``harness.spec.schema`` builds ``RunConfig`` from the registry's sections) imports no backend package; the
checks of these knobs are the backend's (``harness.backends.verl.config.validate``), run when a spec is validated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class VerlParallelConfig:
    """How one model is split over GPUs (set by the model preset)."""

    tp: int = 1  # training tensor parallel (megatron)
    pp: int = 1  # training pipeline parallel (megatron)
    cp: int = 1  # training context parallel (megatron)
    ep: int = 1  # training expert parallel (megatron, MoE)
    etp: Optional[int] = None  # expert tensor parallel (megatron; null = verl's default)
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True  # FSDP: model.enable_gradient_checkpointing (megatron ignores it)
    #: megatron: none | selective (core attention) | full (whole layers, uniform, recompute_num_layers)
    recompute: str = "none"
    recompute_num_layers: int = 1  # megatron full recompute: layers per checkpointed chunk
    #: Adam on the CPU. megatron: optimizer_cpu_offload (offload fraction 1), the GPU keeps bf16
    #: weights + fp32 grads; fsdp2: CPUOffloadPolicy (offload_policy), sharded weights, grads and
    #: Adam live on the CPU and each layer is gathered to the GPU for its forward/backward (memory.py)
    cpu_adam: bool = False
    use_remove_padding: bool = True
    micro_batch_per_gpu: int = 4  # actor update and log-prob micro batch (when use_dynamic_bsz is false)
    use_dynamic_bsz: bool = False  # pack micro batches by tokens instead
    max_token_len_per_gpu: int = 16384  # token budget per micro batch when use_dynamic_bsz
    rollout_tp: int = 1  # vLLM tensor parallel per replica
    rollout_ep: int = 1  # vLLM expert parallel per replica
    gpu_memory_utilization: float = 0.6  # share of GPU memory vLLM may take (colocated with training)


@dataclass
class VerlDataConfig:
    """Where the prompts come from (prepared beforehand by ``python -m harness.backends.verl.data``)."""

    root: str = "data/verl"  # relative to the project root, or absolute (a shared filesystem on a cluster)
    train_files: Optional[str] = None  # null = <root>/<task dir>/train.parquet
    val_files: Optional[str] = None  # null = <root>/<task dir>/test.parquet
    max_prompt_length: int = 512
    max_response_length: int = 1024
    reward: Optional[str] = None  # "file.py:function" custom reward; null = the task's default


@dataclass
class VerlArchConfig:
    """What ``--plan`` needs beyond ``model.*`` to count a checkpoint's parameters (its config.json)."""

    vocab_size: int = 151936
    n_kv_heads: int = 4
    head_dim: int = 128
    tie_embeddings: bool = False


@dataclass
class VerlConfig:
    strategy: str = "fsdp"  # fsdp | fsdp2 | megatron (R3 needs megatron; RAIS needs fsdp/fsdp2)
    #: which verl trainer runs (``trainer.use_v1=false`` for legacy); see TRAINERS
    trainer: str = "legacy"
    rollout: str = "vllm"
    nnodes: int = 1
    gpus_per_node: int = 8
    parallel: VerlParallelConfig = field(default_factory=VerlParallelConfig)
    data: VerlDataConfig = field(default_factory=VerlDataConfig)
    arch: VerlArchConfig = field(default_factory=VerlArchConfig)
    gpu_memory_gb: float = 80.0  # per GPU, for --plan (H100 80GB)
    #: verl's dual-clip bound for negative advantages; null = off, as in the harness's loss (docs/design.md section 2)
    dual_clip_c: Optional[float] = None
    val_every: int = 0  # validation every k steps (0 = never)
    #: RAIS on verl rides on our FSDP engine patch (plugins/rais_fsdp.py), not yet run on a GPU
    experimental_rais: bool = False
    #: passed to the tokenizer's chat template, e.g. {enable_thinking: false} for Qwen3 (model presets)
    chat_template_kwargs: dict = field(default_factory=dict)
    #: raw verl overrides appended last, e.g. ["actor_rollout_ref.rollout.enforce_eager=True"]
    extra_overrides: list = field(default_factory=list)
    #: multi-turn tool use: a file of verl tools, a ``.py`` of ``@function_tool`` functions (verl builds each
    #: tool's schema from its signature and docstring) or a ``.yaml`` tool config (BaseTool classes + schemas);
    #: relative to the project root. Set, the rollout runs verl's ToolAgentLoop (the estimator's own multi-turn
    #: loop: mean_n's ``harness_mean_n_tool``); null = single-turn. docs/verl.md, "multi-turn mean_n"
    tools: Optional[str] = None
    #: where verl's checkpoints go: an absolute folder (a shared filesystem with room for them, e.g. a scratch
    #: space: a Qwen3-30B-A3B checkpoint with Adam states is ~400 GB); each run writes
    #: ``<checkpoint_dir>/<experiment>/<signature>``. null = ``$SCRATCH/moe-rl-harness/verl_checkpoints`` where the
    #: job's environment sets an absolute ``$SCRATCH``, else ``<run_dir>/verl_checkpoints`` (translate.checkpoint_root)
    checkpoint_dir: Optional[str] = None
    #: what a finished run keeps of its checkpoints once its last metrics are in the store (retention.py): ``none``
    #: (all deleted), ``hf`` (the last one as Hugging Face weights, ``<checkpoint root>/hf_model``, verl's
    #: model_merger), ``last`` (verl's last checkpoint, resumable). Not identity (harness.spec.identity)
    keep_checkpoint: str = "none"
    #: ``moe/routing_flip_rate`` on verl (megatron, MoE, a decoupled estimator without R3, one update per step):
    #: vLLM returns its routes, Megatron records its own in the old-log-prob pass (``router_replay.mode=R2``, which
    #: replays them in the update) and ``plugins/routing.py`` compares them. docs/verl.md, "Routing agreement"
    routing_metrics: bool = False
