"""The engine's sampler (``Sampling``, a part of ``InferenceEngine``), as vLLM's: ``sampler_logp``, the processed
distribution (temperature, top-k, top-p), one sampled token per row, and the log-probs the engine reports
(``logprobs_mode``, as vLLM's: ``processed`` = the exact distribution sampled from, after temperature, top-k and
top-p; ``raw`` = the model's log-softmax before them).

A token is drawn by the Gumbel-max trick, ``argmax(sampler_logp + g)`` with ``g`` keyed Gumbel(0, 1) draws (stream
``sample``, ``harness.backends.local.philox``; a draw of the engine call whose logits it samples from): a draw
from the softmax of ``sampler_logp``, for every seed and row of a pack in one computation; a token outside the
support (-inf) stays -inf and is never drawn.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.backends.local.inference.kernels import _Call


def sampler_logp(logp: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The processed distribution over the last axis, in vLLM's order (``vllm/v1/sample/sampler.py``:
    temperature, then ``apply_top_k_top_p``), as log-probs (-inf outside the support):

        l    = log_softmax(logp / T)                                  (T = 1: unchanged)
        top-k: l_v = -inf where l_v < (k-th largest l)                  (ties kept), renormalised
        top-p: sort ascending, c_j = cumsum_j exp(l_(j)); drop the tokens with c_j <= 1 - p
               (the largest always kept), renormalised

    so top-p keeps the smallest head of the (top-k-truncated) distribution whose mass reaches p."""
    if temperature != 1.0:
        logp = torch.log_softmax(logp / temperature, -1)
    if top_k > 0:
        kth = logp.topk(top_k, -1).values[..., -1:]
        logp = torch.log_softmax(logp.masked_fill(logp < kth, float("-inf")), -1)
    if top_p < 1.0:
        sorted_, idx = logp.sort(-1)  # ascending, as vLLM
        drop = sorted_.exp().cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logp = torch.log_softmax(logp.masked_fill(drop.scatter(-1, idx, drop), float("-inf")), -1)
    return logp


class Sampling:
    """The sampler of ``InferenceEngine``: its ``cfg`` (temperature, top-k, top-p, ``logprobs_mode``) and one
    the engine's keys (its ``seeds``, ``step`` and call counter); the model distribution it processes is
    ``Noise._model_logp``."""

    def _sampler_logp(self, logp: Tensor) -> Tensor:
        """The processed distribution the sampler draws from (temperature, top-k, top-p: ``sampler_logp``)."""
        return sampler_logp(logp, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)

    def _reported(self, model_logp: Tensor, sampler_logp: Tensor) -> Tensor:
        return sampler_logp if self.cfg.logprobs_mode == "processed" else model_logp

    def _sample(self, logits: Tensor, call: _Call) -> tuple[Tensor, Tensor]:
        """One token per row from the last position's logits [S, B, t, V] of engine call ``call``: (token
        [S, B, 1], its reported log-prob [S, B, 1]), by Gumbel-max on the call's keyed draws (module docstring)."""
        model_logp = self._model_logp(logits[:, :, -1])
        sampler_logp = self._sampler_logp(model_logp)
        g = call.gumbel("sample", sampler_logp.shape[1:])
        nxt = (sampler_logp + g).argmax(-1, keepdim=True)
        return nxt, self._reported(model_logp, sampler_logp).gather(-1, nxt)
