"""The engine's scoring (``Scoring``, a part of ``InferenceEngine``), like vLLM's ``prompt_logprobs``: one prefill
over prompt + response, the log-probs of the response tokens. ``score(tokens, n)`` returns n independent scorings
of every seed of a pack in one engine call, one batched forward over S x n x B rows (each pass of each seed its own
split-K factor, combine orders and noise draws: the call's keyed draws, ``kernels._Call``), in the engine's
``logprobs_mode``.

vLLM's ``prompt_logprobs`` (what verl's mean_n loop re-scores with) are always the raw distribution whatever
``logprobs_mode`` (docs/engines.md, "Sampler"): here ``processed`` scoring applies the sampler, so that mean_n
estimates the distribution actually sampled from; verl runs mean_n only where the two agree (T = 1, no top-k /
top-p).
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.backends.local.inference.kernels import _Call


class Scoring:
    """``score`` and ``score_once``, over ``InferenceEngine``'s forward, perturbations and sampler."""

    @torch.no_grad()
    def score(self, tokens: Tensor, prompt_len: int, n: int, stream: str | None = None) -> Tensor:
        """n independent scorings [n, B, R] ([S, n, B, R] for pack tokens [S, B, T]) in one batched prefill over
        S x n x B rows: one engine call, each pass its own split-K factor, combine orders and noise draws;
        ``stream``: None (the engine's streams) or one stream of its own (the diagnostics' ``score``: their calls
        never move the numbers of the estimator's).

        On a CPU, a pack of more than ``score_rows`` rows (S x n x B) is scored seed by seed, each over its n x B
        rows: the same engine call, so bitwise the same numbers (the draws are keyed by seed), but cache-sized rows
        (S x n x B rows in one forward were 2.3x slower for a pack of 32 on 2 cores, docs/speed.md)."""
        single = tokens.dim() == 2
        if single:
            tokens = tokens[None]
        s_, b = tokens.shape[:2]
        call_id = self._next_call(stream)
        if s_ > 1 and self.score_rows is not None and s_ * n * b > self.score_rows:
            out = torch.stack([self.seed_view(i)._score(tokens[i:i + 1], prompt_len, n, call_id, stream)[0]
                               for i in range(s_)])
        else:
            out = self._score(tokens, prompt_len, n, call_id, stream)
        return out[0] if single else out

    def _score(self, tokens: Tensor, prompt_len: int, n: int, call_id: int, stream: str | None) -> Tensor:
        """The scorings [S, n, B, R] of pack tokens [S, B, T] as engine call number ``call_id``: one forward."""
        s_, b, t = tokens.shape
        call = _Call(self.cfg, self.seeds, self.step, call_id, n, self.r, stream, self.host_splits)
        inputs = tokens[:, None, :, :-1].expand(s_, n, b, t - 1).reshape(s_ * n, b, t - 1)  # last: predicts nothing
        logits, _, _ = self._forward(call, inputs, 0, None, keep_from=prompt_len - 1)
        model_logp = self._model_logp(logits)
        logp = self._reported(model_logp, self._sampler_logp(model_logp))
        target = tokens[:, None, :, prompt_len:, None].expand(s_, n, b, t - prompt_len, 1).reshape(s_ * n, b, -1, 1)
        return logp.gather(-1, target).squeeze(-1).view(s_, n, b, -1)

    def score_once(self, tokens: Tensor, prompt_len: int, stream: str | None = None) -> Tensor:
        """One prefill pass over prompt+response: log-probs of the response tokens [B, R]."""
        return self.score(tokens, prompt_len, 1, stream)[0]
