"""A/B of the experts' grouped GEMMs and the all-parameter AdamW against what they replaced, in one process.

    python benchmarks/grouped_ab.py                          # default spec, 3 warm-up + 20 interleaved steps each
    python benchmarks/grouped_ab.py estimator=mean_n estimator.n=8 --steps 12

Two trainers of the same spec and seed step in turn: B runs this code; A runs it with the implementations this
session replaced, kept below as they were (the experts as one zero-padded batched GEMM per seed in the training
engine and per call in the inference engine; AdamW as a loop over parameters). Both must log bitwise the same
metrics at every step (checked: the speed-up changes no number), and the medians of their phase timers are
compared step for step, so the ratio survives a machine whose speed drifts. One torch thread.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import metrics as M  # noqa: E402
from harness.spec import load  # noqa: E402

PHASES = {"rollout": M.TIME_ROLLOUT, "pi_old": M.TIME_OLD_LOGPROB, "diagnostics": M.TIME_DIAGNOSTICS,
          "update": M.TIME_UPDATE, "step": M.TIME_STEP}


# ---- the implementations before (a938da0) ---------------------------------------------------------------------
def padded_train_moe(w, p, x, top_k, replay):
    from harness.backends.local.train_engine import route

    def experts(x, selected, gates, w_gate, w_up, w_down):
        n, d = x.shape
        e, _, f = w_gate.shape
        k = selected.shape[-1]
        flat = selected.reshape(-1)
        order = flat.argsort(stable=True)
        expert = flat[order]
        counts = torch.bincount(flat, minlength=e)
        cap = int(counts.max())
        row = expert * cap + torch.arange(n * k) - (counts.cumsum(0) - counts)[expert]
        token = order // k
        xe = x.new_zeros(e * cap, d).index_copy(0, row, x.index_select(0, token)).view(e, cap, d)
        gu = torch.bmm(xe, torch.cat([w_gate, w_up], -1))
        h = F.silu(gu[..., :f]) * gu[..., f:]
        y = torch.bmm(h, w_down).view(e * cap, d).index_select(0, row) * gates.reshape(-1)[order][:, None]
        return x.new_zeros(n, d).index_add(0, token, y)

    logits = torch.bmm(x, w[p + "router"])
    selected, gates = route(logits, top_k, replay)
    outs = [experts(x[s], selected[s], gates[s], w[p + "w_gate"][s], w[p + "w_up"][s], w[p + "w_down"][s])
            for s in range(x.shape[0])]
    return torch.stack(outs), logits, selected


def padded_infer_experts(self, p, x, key, gates, dest):
    act, w_gu, w_down = self.act, self.w[p + "w_gate_up"], self.w[p + "w_down_flat"]
    m, d = x.shape
    groups, f, k = w_gu.shape[0], w_down.shape[1], key.numel() // m
    order = key.argsort(stable=True)
    group = key[order]
    counts = torch.bincount(key, minlength=groups)
    cap = int(counts.max())
    row = group * cap + torch.arange(m * k) - (counts.cumsum(0) - counts)[group]
    xe = x.new_zeros(groups * cap, d).index_copy_(0, row, x.index_select(0, order // k)).view(groups, cap, d)
    gu = torch.bmm(xe.float(), w_gu).to(act)
    h = F.silu(gu[..., :f]) * gu[..., f:]
    ye = torch.bmm(h.float(), w_down).to(act).view(groups * cap, d).index_select(0, row)
    ye = ye * gates.index_select(0, order)[:, None]
    return torch.empty_like(ye).index_copy_(0, dest.index_select(0, order), ye)


@torch.no_grad()
def loop_adamw_step(self, active):
    b1, b2 = self.betas
    self.t += active.cpu().double()
    t = self.t.clamp(min=1)
    step_size = (self.lr / (1 - b1 ** t)).float()
    bc2_sqrt = torch.sqrt(1 - b2 ** t).float()
    for k, p in self.params.items():
        shape = (-1, *([1] * (p.dim() - 1)))
        g, m, v = p.grad, self.m[k], self.v[k]
        a = active.view(shape)
        new_p = p * (1 - self.lr * self.wd) if self.wd else p
        new_m = m * b1 + g * (1 - b1)
        new_v = v * b2 + (g * g) * (1 - b2)
        denom = torch.sqrt(new_v) / bc2_sqrt.view(shape) + self.eps
        new_p = new_p - (new_m / denom) * step_size.view(shape)
        p.copy_(torch.where(a, new_p, p))
        m.copy_(torch.where(a, new_m, m))
        v.copy_(torch.where(a, new_v, v))


@contextlib.contextmanager
def before():
    """The replaced implementations in place of the current ones (restored on exit)."""
    from harness.backends.local import train_engine
    from harness.backends.local.inference_engine import InferenceEngine
    from harness.backends.local.optim import PackAdamW

    saved = (train_engine._moe, InferenceEngine._experts, PackAdamW.step)
    train_engine._moe, InferenceEngine._experts, PackAdamW.step = padded_train_moe, padded_infer_experts, loop_adamw_step
    try:
        yield
    finally:
        train_engine._moe, InferenceEngine._experts, PackAdamW.step = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="spec overrides, e.g. estimator=mean_n estimator.n=8")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    from harness import numerics
    numerics.pin()  # before torch's first operator (harness/numerics.py)
    torch.set_num_threads(1)
    from harness.backends.local.trainer import LocalTrainer

    cfg = load(args.overrides)
    a, b = LocalTrainer(cfg, torch.device("cpu")), LocalTrainer(cfg, torch.device("cpu"))
    times: dict[str, dict[str, list[float]]] = {"A": {k: [] for k in PHASES}, "B": {k: [] for k in PHASES}}
    for i in range(args.warmup + args.steps):
        if i % 2:  # alternate which goes first
            vb = b.run_step()
            with before():
                va = a.run_step()
        else:
            with before():
                va = a.run_step()
            vb = b.run_step()
        differ = [k for k in va if not k.startswith(("time/", "tokens/"))
                  and not (va[k] == vb[k] or (va[k] != va[k] and vb[k] != vb[k]))]
        if differ:
            raise SystemExit(f"step {i}: the two implementations logged different values: {differ[:5]}")
        if i >= args.warmup:
            for name, key in PHASES.items():
                times["A"][name].append(va[key])
                times["B"][name].append(vb[key])
    print(f"spec: {' '.join(args.overrides) or 'defaults'}; {args.steps} interleaved steps after {args.warmup}; "
          "every logged value bitwise equal in A and B; medians (ms)")
    print(f"  {'phase':12s} {'A: before':>10s} {'B: now':>10s} {'B / A':>7s}")
    for name in PHASES:
        ma, mb = statistics.median(times["A"][name]), statistics.median(times["B"][name])
        print(f"  {name:12s} {ma * 1e3:10.1f} {mb * 1e3:10.1f} {mb / ma:6.2f}x")
    ratios = [tb / ta for ta, tb in zip(times["A"]["step"], times["B"]["step"])]
    print(f"  ratio step B / A, median of the paired steps: {statistics.median(ratios):.2f}x "
          f"(IQR {statistics.quantiles(ratios, n=4)[0]:.2f}-{statistics.quantiles(ratios, n=4)[2]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
