"""AdamW over a seed pack: stacked parameters [S, ...], one step count per seed, and a per-seed
``active`` mask (a seed whose loss or gradient is non-finite skips its update, alone or in a pack).

    p <- p (1 - lr wd)
    m <- b1 m + (1 - b1) g            v <- b2 v + (1 - b2) g^2
    p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)        t = the seed's step

(torch.optim.AdamW's update, decoupled weight decay.) Only single elementwise ops on whole tensors,
with per-seed factors broadcast over the seed axis: slice s gets exactly the arithmetic of a pack of
one, so a seed's curve does not depend on its pack.
"""
from __future__ import annotations

import torch
from torch import Tensor


class PackAdamW:
    def __init__(self, params: dict[str, Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = params
        self.lr, self.wd, self.betas, self.eps = lr, weight_decay, betas, eps
        size = next(iter(params.values())).shape[0]
        self.t = torch.zeros(size, dtype=torch.float64)  # steps taken, per seed
        self.m = {k: torch.zeros_like(p) for k, p in params.items()}
        self.v = {k: torch.zeros_like(p) for k, p in params.items()}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    @torch.no_grad()
    def step(self, active: Tensor) -> None:
        """One update of the seeds where ``active`` [S] (bool) is true: in place over all parameters at once
        (``torch._foreach_*``, per element exactly the arithmetic of the formula above; tests/test_golden.py holds
        it bitwise); a seed that skips gets its parameters and moments back."""
        b1, b2 = self.betas
        self.t += active.cpu().double()
        t = self.t.clamp(min=1)
        keys = list(self.params)
        ps, gs = [self.params[k] for k in keys], [self.params[k].grad for k in keys]
        ms, vs = [self.m[k] for k in keys], [self.v[k] for k in keys]
        dev = ps[0].device
        step_size = (self.lr / (1 - b1 ** t)).float().to(dev)  # [S]
        bc2_sqrt = torch.sqrt(1 - b2 ** t).float().to(dev)
        shapes = [(-1, *([1] * (p.dim() - 1))) for p in ps]
        skip = not bool(active.all())
        kept = [[x.clone() for x in xs] for xs in (ps, ms, vs)] if skip else None
        if self.wd:
            torch._foreach_mul_(ps, 1 - self.lr * self.wd)
        torch._foreach_mul_(ms, b1)
        torch._foreach_add_(ms, torch._foreach_mul(gs, 1 - b1))
        torch._foreach_mul_(vs, b2)
        torch._foreach_add_(vs, torch._foreach_mul(torch._foreach_mul(gs, gs), 1 - b2))
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, [bc2_sqrt.view(s) for s in shapes])
        torch._foreach_add_(denom, self.eps)
        step = torch._foreach_div(ms, denom)
        torch._foreach_mul_(step, [step_size.view(s) for s in shapes])
        torch._foreach_sub_(ps, step)
        if skip:
            active = active.to(dev)
            for xs, olds in zip((ps, ms, vs), kept):
                for i, (x, old) in enumerate(zip(xs, olds)):
                    x.copy_(torch.where(active.view(shapes[i]), x, old))

    def state(self, s: int) -> dict:
        return {"t": float(self.t[s]), "m": {k: x[s].clone() for k, x in self.m.items()},
                "v": {k: x[s].clone() for k, x in self.v.items()}}

    def load_state(self, s: int, state: dict) -> None:
        self.t[s] = state["t"]
        for k in self.m:
            self.m[k][s].copy_(state["m"][k])
            self.v[k][s].copy_(state["v"][k])
