"""The engine's explicit perturbations (``Noise``, a part of ``InferenceEngine``), off by default
(docs/design.md section 3): router-logit noise before top-k, output-logit noise, and a biased down-weighting of
low-probability tokens.

Router noise may be *sparse* (``router_noise_rate`` < 1, issue 31): each (token, layer) router row is hit with
probability rate (a keyed uniform of stream ``noise`` per row, fresh per call), the others get none, so with a large
sigma a few tokens flip experts and the rest score as the natural engine: sparse, heavy-tailed log-prob deviations
instead of dense Gaussian ones. The two noise knobs draw fresh N(0, sigma^2) per call (keyed normals of stream ``noise``, ``kernels._Call.normal``:
a pure function of the seed, the step, the call and the draw, for every seed of a pack in one call); in ``deterministic`` mode they become *frozen*: the same
scale, but a fixed function of the hidden state (a fixed random projection, ``frozen_projections``), so the engine
no longer differs from itself but carries a large fixed bias (the ``deterministic(frozen)`` arm). Deterministic
inference proper (the ``deterministic`` estimator, ``noise: removed``) runs this mode with both noise knobs at 0
(``Estimator.inference``): precision is the only difference left. ``scale`` (None, or a per-seed [S] tensor set by
``kl_control.KLController`` in a KL-held run) multiplies the noise sigmas, or the bias's log delta, per seed.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.backends.local.inference.kernels import _Call


def frozen_projections(seeds: list[int], d_model: int, n_experts: int, vocab_size: int,
                       device: torch.device) -> dict[str, Tensor]:
    """The fixed projections [S, d, *] of each seed (its own ``torch.Generator``, drawn once at construction): the
    deterministic mode's stand-in for fresh noise, one for the router logits and one for the output logits."""
    frozen = {"router": [], "logits": []}
    for s in seeds:
        g = torch.Generator().manual_seed(s * 1000 + 6)
        frozen["router"].append(torch.randn(d_model, n_experts, generator=g))
        frozen["logits"].append(torch.randn(d_model, vocab_size, generator=g))
    return {k: torch.stack(v).to(device) for k, v in frozen.items()}


class Noise:
    """The perturbations of ``InferenceEngine``: its ``cfg`` knobs, ``frozen`` projections and per-seed ``scale``."""

    def _sigma(self, sigma: float, rows: int, ndim: int) -> "float | Tensor":
        """A perturbation's size for ``rows`` seed-major leading rows (S x calls) of an ndim tensor: the configured
        value, or times each row's seed ``scale`` in a KL-held run."""
        if self.scale is None:
            return sigma
        return (sigma * self.scale).repeat_interleave(rows // self.scale.numel()).view(-1, *([1] * (ndim - 1)))

    def _noise(self, call: _Call, x: Tensor, which: str) -> Tensor:
        """Standard-normal noise per entry: fresh per call, or frozen (a function of x) when deterministic."""
        proj = self.frozen[which]  # [S, d, P]
        if not self.cfg.deterministic:
            return call.normal("noise", (*x.shape[1:-1], proj.shape[-1]))
        z = x.float()
        z = z / z.norm(dim=-1, keepdim=True).clamp(min=1e-6)  # unit rows: z @ proj ~ N(0, 1) per entry
        pg = call.per_group(proj)
        return torch.bmm(z.reshape(z.shape[0], -1, z.shape[-1]), pg).view(*z.shape[:-1], pg.shape[-1])

    def _model_logp(self, logits: Tensor) -> Tensor:
        """The engine's model distribution (with the biased perturbation when it is on)."""
        logp = torch.log_softmax(logits, -1)
        if self.cfg.bias_delta != 1.0:
            low = logp.exp() < self.cfg.bias_threshold
            log_delta = torch.log(torch.tensor(self.cfg.bias_delta))
            if self.scale is not None:  # delta ** c per seed
                log_delta = self._sigma(float(log_delta), logp.shape[0], logp.dim())
            logp = torch.log_softmax(logp + low * log_delta, -1)
        return logp
