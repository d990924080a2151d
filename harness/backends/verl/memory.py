"""Per-GPU memory plan of a verl spec (``python -m harness.run backend=verl ... --plan``).

An estimate from the architecture and the parallel layout, not a measurement. verl colocates
training and vLLM on the same GPUs and swaps them, so there are two peaks; the spec fits when
both stay under ``(1 - MARGIN) * verl.gpu_memory_gb``.

Parameters (h = d_model, L = n_layers, a = n_heads, g = n_kv_heads, d = head_dim, V = vocab,
E = n_experts, k = top_k, f = d_expert (MoE) or d_ff (dense)):

    attention/layer = h*a*d + 2*h*g*d + a*d*h + 2*d (q/k norms) + 2*h (layer norms)
    MoE/layer       = E*3*h*f (SwiGLU experts) + h*E (router);  dense/layer = 3*h*f
    embeddings      = V*h (+ V*h for an untied LM head) + h (final norm)

Sharding. Megatron (N GPUs, tp, pp, cp, ep, etp): dense parameters / (tp*pp), experts /
(ep*etp*pp), router / pp; the distributed optimizer shards its states over the data-parallel size
dp = N/(tp*pp*cp) for dense and the expert data-parallel size edp = N/(ep*etp*pp) for experts
(with TP2/EP8 on 8 GPUs edp = 1: expert states are not sharded at all). FSDP: everything / N.

Bytes per parameter on the GPU during the update:

    megatron   bf16 weight 2 + fp32 main grad 4 + Adam (fp32 master, m, v) 12 / dp   (0 with cpu_adam)
    fsdp       fp32 weight 4 + fp32 grad 4 + Adam (m, v) 8, all / N
               + two gathered bf16 layers (FSDP's unsharded working set with prefetch)
    fsdp2 + cpu_adam (CPUOffloadPolicy): 0 (the 16 B/param live in host memory)

Activations of one micro batch of s = max_token_len_per_gpu tokens (or micro_batch * (prompt +
response length)), bf16, flash attention (no s^2 term), megatron sequence parallel over tp:

    attention  = s * (4h + 2(a + 2g)d + 2ad) / tp     MoE = s * (k(2h + 6f) + 4E) / etp   dense = s(2h + 6f)/tp
    layer      = attention + MoE|dense
    stored     = L*layer (no recompute) | L*s*h*2/tp + layer (full recompute / checkpointing)
               | L*(layer - attention core 2ad*s/tp) + layer (selective: core attention recomputed)
    logits     = s * V * (2 + 4 + 4) / tp     (bf16 logits, fp32 log-softmax and its gradient)

The rollout peak is vLLM's share ``gpu_memory_utilization * gpu_memory_gb`` plus what training
leaves on the GPU while vLLM is awake: weights unless ``param_offload`` (megatron: + its grad
buffer), optimizer states unless ``optimizer_offload`` or cpu_adam. Both peaks add OVERHEAD_GB
(CUDA context, NCCL buffers, allocator fragmentation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig

GB = 1e9
#: CUDA context, NCCL buffers and allocator fragmentation, per GPU (a rule of thumb, not measured)
OVERHEAD_GB = 4.0
#: the plan fits when each peak is at most (1 - MARGIN) of the GPU's memory
MARGIN = 0.10
#: logits bytes per vocabulary entry and token: bf16 logits + fp32 log-softmax + its gradient
LOGIT_BYTES = 2 + 4 + 4


@dataclass
class Params:
    """Parameter counts of the whole model, by kind (formulas in the module docstring)."""

    attention: int  # all layers, incl. norms
    experts: int  # all layers, all experts (MoE) or the dense MLPs
    router: int
    embeddings: int  # input embedding + LM head (if untied) + final norm
    moe: bool

    @property
    def dense(self) -> int:
        """Everything sharded like a dense layer (megatron TP/PP, dense data parallel)."""
        return self.attention + self.embeddings + (0 if self.moe else self.experts)

    @property
    def total(self) -> int:
        return self.attention + self.experts + self.router + self.embeddings


@dataclass
class Plan:
    """Per-GPU bytes (GB) of the update peak and the rollout peak, and whether both fit."""

    params_total: int
    layout: str
    weights: float
    grads: float
    optimizer: float
    optimizer_cpu: bool
    activations: float
    logits: float
    fsdp_gathered: float
    rollout_vllm: float
    rollout_residue: float
    overhead: float = OVERHEAD_GB
    gpu_memory_gb: float = 80.0
    notes: list = field(default_factory=list)
    host_per_node: float = 0.0  # GB of training state in host memory per node (host_memory)
    optimizer_host: float = 0.0  # GB per GPU of optimizer states kept in host memory (cpu_adam / optimizer_offload)
    host_parts: str = "nothing offloaded"

    @property
    def update_peak(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.fsdp_gathered + self.overhead

    @property
    def rollout_peak(self) -> float:
        return self.rollout_vllm + self.rollout_residue + self.overhead

    @property
    def budget(self) -> float:
        return (1 - MARGIN) * self.gpu_memory_gb

    @property
    def fits(self) -> bool:
        return self.update_peak <= self.budget and self.rollout_peak <= self.budget

    def text(self) -> str:
        rows = [("weights", self.weights), ("gradients", self.grads),
                ("optimizer states" + (" (on CPU: cpu_adam)" if self.optimizer_cpu else ""), self.optimizer),
                ("activations", self.activations), ("logits", self.logits)]
        if self.fsdp_gathered:
            rows.append(("FSDP gathered layers", self.fsdp_gathered))
        rows += [("overhead", self.overhead), ("= update peak", self.update_peak),
                 ("vLLM (gpu_memory_utilization)", self.rollout_vllm),
                 ("training state left on GPU", self.rollout_residue), ("overhead", self.overhead),
                 ("= rollout peak", self.rollout_peak)]
        out = [f"# per-GPU memory plan: {self.params_total / 1e9:.2f}B parameters, {self.layout}",
               "# estimate from the architecture (harness/backends/verl/memory.py), not a measurement"]
        out += [f"{name:<40} {gb:8.1f} GB" for name, gb in rows]
        out.append(f"{'host memory per node':<40} {self.host_per_node:8.1f} GB ({self.host_parts}; plus Ray, vLLM and "
                   "the Python processes themselves, not estimated)")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        out.append(f"{verdict}: both peaks must stay under {self.budget:.1f} GB "
                   f"({1 - MARGIN:.0%} of {self.gpu_memory_gb:g} GB)")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def params(cfg: "RunConfig") -> Params:
    m, a = cfg.model, cfg.verl.arch
    h, L, d, g = m.d_model, m.n_layers, a.head_dim, a.n_kv_heads
    attention = L * (h * m.n_heads * d + 2 * h * g * d + m.n_heads * d * h + 2 * d + 2 * h)
    moe = m.kind == "moe"
    f = m.d_expert if moe else m.ffn_hidden
    experts = L * (m.n_experts if moe else 1) * 3 * h * f
    router = L * h * m.n_experts if moe else 0
    embeddings = a.vocab_size * h * (1 if a.tie_embeddings else 2) + h
    return Params(attention=attention, experts=experts, router=router, embeddings=embeddings, moe=moe)


#: bytes per parameter of a verl checkpoint (model + optimizer + extra): FSDP fp32 weights + Adam m, v;
#: megatron bf16 weights + fp32 master + m, v
CKPT_BYTES = {"fsdp": 12, "fsdp2": 12, "megatron": 14}
#: assumed write speed (GB/s, the whole job) to the checkpoint folder; HARNESS_CKPT_WRITE_GBPS sets it
CKPT_WRITE_GBPS = 1.0
SAVE_FLOOR_S = 60.0  # the shortest save budget


def checkpoint_gb(cfg: "RunConfig") -> float:
    """The size of one verl checkpoint of this spec (GB), from the architecture."""
    return params(cfg).total * CKPT_BYTES.get(cfg.verl.strategy, 12) / GB


def write_gbps() -> float:
    import os

    from harness.errors import ConfigError

    raw = os.environ.get("HARNESS_CKPT_WRITE_GBPS", str(CKPT_WRITE_GBPS))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError("HARNESS_CKPT_WRITE_GBPS", f"HARNESS_CKPT_WRITE_GBPS must be a write speed in GB/s > 0 "
                          f"(e.g. 2.5), got {raw!r}")
    return value


def save_budget_s(cfg: "RunConfig") -> float:
    """Seconds one checkpoint save may take: its size at :func:`write_gbps`, at least ``SAVE_FLOOR_S``."""
    return max(SAVE_FLOOR_S, checkpoint_gb(cfg) / write_gbps())


def tokens_per_micro_batch(cfg: "RunConfig") -> int:
    p, d = cfg.verl.parallel, cfg.verl.data
    return p.max_token_len_per_gpu if p.use_dynamic_bsz else p.micro_batch_per_gpu * (d.max_prompt_length + d.max_response_length)


def activations(cfg: "RunConfig", tp: int, etp: int, layers: int) -> float:
    """Bytes of stored activations for one micro batch on one GPU (module docstring)."""
    m, a, p = cfg.model, cfg.verl.arch, cfg.verl.parallel
    s, h, d, g = tokens_per_micro_batch(cfg), m.d_model, a.head_dim, a.n_kv_heads
    core = 2 * m.n_heads * d * s / tp
    attention = s * (4 * h + 2 * (m.n_heads + 2 * g) * d) / tp + core
    if m.kind == "moe":
        mlp = s * (m.top_k * (2 * h + 6 * m.d_expert) + 4 * m.n_experts) / etp
    else:
        mlp = s * (2 * h + 6 * m.ffn_hidden) / tp
    layer = attention + mlp
    megatron = cfg.verl.strategy == "megatron"
    recompute = p.recompute if megatron else ("full" if p.gradient_checkpointing else "none")
    if recompute == "full":
        return layers * s * h * 2 / tp + layer
    if recompute == "selective":
        return layers * (layer - core) + layer
    return layers * layer


def plan(cfg: "RunConfig") -> Plan:
    v = cfg.verl
    p = v.parallel
    n = v.nnodes * v.gpus_per_node
    c = params(cfg)
    s = tokens_per_micro_batch(cfg)
    notes = []
    if v.strategy == "megatron":
        etp = p.etp or 1
        dp, edp = n // (p.tp * p.pp * p.cp), n // (p.ep * etp * p.pp)
        dense, experts = c.dense / (p.tp * p.pp), (c.experts / (p.ep * etp * p.pp) if c.moe else 0.0)
        router = c.router / p.pp
        weights = 2 * (dense + experts + router)
        grads = 4 * (dense + experts + router)
        optimizer = 12 * ((dense + router) / dp + experts / edp)
        layout = (f"megatron TP{p.tp} PP{p.pp} CP{p.cp} EP{p.ep} ETP{etp} on {n} GPUs "
                  f"(dp={dp}, expert dp={edp}), recompute={p.recompute}, cpu_adam={p.cpu_adam}")
        if c.moe and edp == 1 and not p.cpu_adam:
            notes.append("expert data parallel size 1: the distributed optimizer cannot shard expert Adam states")
        act = activations(cfg, p.tp, etp, cfg.model.n_layers // p.pp)
        logits = s * cfg.verl.arch.vocab_size * LOGIT_BYTES / p.tp
        gathered = 0.0
        opt_gpu = 0.0 if p.cpu_adam else optimizer
        residue = (0.0 if p.param_offload else weights + grads) + (0.0 if (p.optimizer_offload or p.cpu_adam) else optimizer)
    else:
        weights, grads, optimizer = 4 * c.total / n, 4 * c.total / n, 8 * c.total / n
        per_layer = (c.attention + c.experts + c.router) / cfg.model.n_layers
        gathered = 2 * 2 * per_layer
        layout = f"{v.strategy} on {n} GPUs, gradient_checkpointing={p.gradient_checkpointing}"
        act = activations(cfg, 1, 1, cfg.model.n_layers)
        logits = s * cfg.verl.arch.vocab_size * LOGIT_BYTES
        opt_gpu = optimizer
        residue = (0.0 if p.param_offload else weights) + (0.0 if p.optimizer_offload else optimizer)
        if p.cpu_adam:  # FSDP2 CPUOffloadPolicy: the shards live on the CPU, layers are gathered to the GPU
            weights = grads = opt_gpu = residue = 0.0
            notes.append(f"host memory per node: ~{16 * c.total / GB * v.gpus_per_node / n:.0f} GB of "
                         "fp32 weights, grads and Adam states (CPUOffloadPolicy)")
    host, parts = host_memory(v.gpus_per_node, weights, grads, optimizer, p, v.strategy, 16 * c.total / n)
    layout += f", {s} tokens per micro batch"
    notes.append(f"checkpoint (weights + Adam): ~{checkpoint_gb(cfg):.0f} GB; the early save before the Slurm time "
                 f"limit gets {save_budget_s(cfg):.0f} s ({write_gbps():g} GB/s; HARNESS_CKPT_WRITE_GBPS sets it)")
    return Plan(params_total=c.total, layout=layout, weights=weights / GB, grads=grads / GB, optimizer=opt_gpu / GB,
                optimizer_cpu=p.cpu_adam, activations=act / GB, logits=logits / GB,
                fsdp_gathered=gathered / GB, rollout_vllm=p.gpu_memory_utilization * v.gpu_memory_gb,
                rollout_residue=residue / GB, gpu_memory_gb=v.gpu_memory_gb, notes=notes, host_per_node=host / GB,
                host_parts=parts,
                optimizer_host=(optimizer / GB if v.strategy == "megatron" and (p.cpu_adam or p.optimizer_offload)
                                else 0.0))


def host_memory(gpus_per_node: int, weights: float, grads: float, optimizer: float, p, strategy: str,
                fsdp_cpu_state: float) -> tuple[float, str]:
    """Bytes of training state in one node's host memory, and what it is: each GPU's optimizer states where they
    live on the CPU (``cpu_adam``: megatron's HybridDeviceOptimizer, 12 B/param sharded like the GPU's would be;
    FSDP2's CPUOffloadPolicy, all 16 B/param of the shard) or are offloaded while vLLM runs
    (``optimizer_offload``), and its weights and gradients where ``param_offload`` moves them, times the node's GPUs."""
    per_gpu, parts = 0.0, []
    if strategy != "megatron" and p.cpu_adam:
        return gpus_per_node * fsdp_cpu_state, "fp32 weights, grads and Adam states (FSDP2 CPUOffloadPolicy)"
    if p.cpu_adam or p.optimizer_offload:
        per_gpu += optimizer
        parts.append("Adam states (cpu_adam)" if p.cpu_adam else "optimizer states (optimizer_offload)")
    if p.param_offload:
        per_gpu += weights + grads
        parts.append("weights and gradients (param_offload)")
    return gpus_per_node * per_gpu, " + ".join(parts) or "nothing offloaded"
