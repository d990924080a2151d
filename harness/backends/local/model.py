"""A Qwen3-MoE-style decoder and its dense twin: parameters and shared building blocks.

RMSNorm, rotary position embeddings, grouped q/k RMSNorm (as Qwen3), a softmax router over
``n_experts`` SwiGLU experts with top-k selection and renormalised top-k gates, untied LM head.
The dense twin replaces the MoE by one SwiGLU of hidden ``top_k * d_expert``: equal active
parameters. The two engines (``train_engine``, ``inference_engine``) read these parameters
through their own forward code paths, as Megatron and vLLM do.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from harness.spec import ModelConfig
from harness.tasks.vocab import BOS, DIGITS, EOS, EQUALS, PAD, PLUS, VOCAB_SIZE  # noqa: F401  (the tasks' vocabulary)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(dtype)


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    ang = positions.float()[:, None] * inv[None, :]  # [T, hd/2]
    return ang.cos(), ang.sin()


@functools.lru_cache(maxsize=128)
def rope_range(start: int, length: int, head_dim: int, theta: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """``rope_tables`` of positions start..start+length-1, cached (the engines ask for the same few every step; the
    same call, so the same numbers). Read only; ordinary tensors even when first asked for in inference mode."""
    with torch.inference_mode(False):
        return rope_tables(torch.arange(start, start + length, device=device), head_dim, theta)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, H, T, hd] with the rotate-half convention of Qwen/Llama."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, None], sin[None, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h = cfg.d_model, cfg.n_heads
        self.n_heads, self.head_dim = h, d // h
        self.q_proj = nn.Parameter(torch.empty(d, d))
        self.k_proj = nn.Parameter(torch.empty(d, d))
        self.v_proj = nn.Parameter(torch.empty(d, d))
        self.o_proj = nn.Parameter(torch.empty(d, d))
        self.q_norm = nn.Parameter(torch.ones(self.head_dim))
        self.k_norm = nn.Parameter(torch.ones(self.head_dim))


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f, e = cfg.d_model, cfg.d_expert, cfg.n_experts
        self.top_k = cfg.top_k
        self.router = nn.Parameter(torch.empty(d, e))
        self.w_gate = nn.Parameter(torch.empty(e, d, f))
        self.w_up = nn.Parameter(torch.empty(e, d, f))
        self.w_down = nn.Parameter(torch.empty(e, f, d))


class DenseMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.ffn_hidden
        self.w_gate = nn.Parameter(torch.empty(d, f))
        self.w_up = nn.Parameter(torch.empty(d, f))
        self.w_down = nn.Parameter(torch.empty(f, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.d_model))
        self.attn = Attention(cfg)
        self.ffn_norm = nn.Parameter(torch.ones(cfg.d_model))
        self.ffn = MoE(cfg) if cfg.kind == "moe" else DenseMLP(cfg)


class Policy(nn.Module):
    """Parameters of the policy (float32 master copy, owned by the TrainEngine)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int = VOCAB_SIZE):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Parameter(torch.empty(vocab_size, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.d_model))
        self.lm_head = nn.Parameter(torch.empty(cfg.d_model, vocab_size))

    @property
    def is_moe(self) -> bool:
        return self.cfg.kind == "moe"

    def reset_parameters(self, generator: torch.Generator) -> None:
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)  # GPT-2 style scaled residual projections
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                    continue
                s = out_std if name.endswith(("o_proj", "w_down")) else std
                p.copy_(torch.randn(p.shape, generator=generator) * s)

    def active_params(self) -> int:
        """Parameters touched per token (router excluded): equal for the MoE and its dense twin."""
        total = 0
        for name, p in self.named_parameters():
            if ".router" in name:
                continue
            if ".ffn.w_" in name and self.is_moe:
                total += p.numel() * self.cfg.top_k // self.cfg.n_experts
            else:
                total += p.numel()
        return total


def build_policy(cfg: ModelConfig, seed: int) -> Policy:
    g = torch.Generator().manual_seed(seed)
    policy = Policy(cfg)
    policy.reset_parameters(g)
    return policy


class PolicyPack(nn.Module):
    """S policies of one config stacked along a leading *seed* axis: every parameter is
    ``[S, *shape]`` (a seed pack). The engines and the trainer run the whole pack with batched
    matmuls; slice ``s`` is exactly the policy of seed ``s`` (``policy(s)``). A plain run is a
    pack of one, so a seed trains the same way alone or in a pack."""

    def __init__(self, cfg: ModelConfig, size: int, vocab_size: int = VOCAB_SIZE):
        super().__init__()
        self.cfg, self.size, self.vocab_size = cfg, size, vocab_size
        shapes = {name: p.shape for name, p in Policy(cfg, vocab_size).named_parameters()}
        self.names = list(shapes)
        self.stacked = nn.ParameterDict(
            {_key(n): nn.Parameter(torch.empty(size, *shape)) for n, shape in shapes.items()})

    @property
    def is_moe(self) -> bool:
        return self.cfg.kind == "moe"

    @classmethod
    def of(cls, policies: list[Policy]) -> "PolicyPack":
        pack = cls(policies[0].cfg, len(policies), policies[0].vocab_size)
        pack.load_policies(policies)
        return pack

    def load_policies(self, policies: list[Policy]) -> None:
        with torch.no_grad():
            for name in self.names:
                self.stacked[_key(name)].copy_(torch.stack([dict(p.named_parameters())[name] for p in policies]))

    def weights(self) -> dict[str, Tensor]:
        """Parameter name (as in ``Policy``) -> stacked tensor [S, ...]."""
        return {n: self.stacked[_key(n)] for n in self.names}

    def policy_state(self, s: int) -> dict[str, Tensor]:
        """The state dict of seed ``s``'s policy (a ``Policy.state_dict()``)."""
        return {n: self.stacked[_key(n)][s].detach().clone() for n in self.names}

    def load_policy_state(self, s: int, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for n in self.names:
                self.stacked[_key(n)][s].copy_(state[n])


def _key(name: str) -> str:
    return name.replace(".", "__")


def stacked_weights(model: "Policy | PolicyPack") -> dict[str, Tensor]:
    """The weights of a pack, or of one policy as a pack of one ([1, ...] views: gradients flow)."""
    if isinstance(model, PolicyPack):
        return model.weights()
    return {n: p[None] for n, p in model.named_parameters()}
