"""Exploratory probe (issue 6; not a harness feature): would split-K batch variance in the MoE expert
matmuls too (as fused-MoE kernels pick tiles by tokens per expert) make the natural MoE noisier than
its dense twin? Patches ``InferenceEngine._layer_moe`` in this process only and prints MoE/dense
var_rollout with and without it, at 2 and 8 layers, on the natural engine (the patched layer has no
router noise and no deterministic mode).

    python scripts/probe_expert_splitk.py
"""
import torch
import torch.nn.functional as F
from harness.backends.local import inference_engine as ie
from harness.backends.local.probe import probe
from harness.config import load

def split_einsum(eq, a, b, split, dim_a, dim_b):
    k = a.shape[dim_a]
    if split == 1 or k % split:
        return torch.einsum(eq, a, b)
    c = k // split
    out = None
    for i in range(split):
        part = torch.einsum(eq, a.narrow(dim_a, i * c, c), b.narrow(dim_b, i * c, c))
        out = part if out is None else out + part
    return out

def layer_moe(self, call, p, x, layer):
    cfg, mc = self.cfg, self.mcfg
    n = x.shape[0]
    logits = call.mm(x, self.w[p + "router"]).float()
    probs = torch.softmax(logits, -1)
    gates, selected = probs.topk(mc.top_k, dim=-1)
    gates = (gates / gates.sum(-1, keepdim=True)).to(self.dtype)
    s = call.split
    h = F.silu(split_einsum("nd,edf->enf", x, self.w[p + "w_gate"], s, 1, 1)) * split_einsum("nd,edf->enf", x, self.w[p + "w_up"], s, 1, 1)
    y_all = split_einsum("enf,efd->end", h, self.w[p + "w_down"], s, 2, 1)
    y = y_all[selected, torch.arange(n)[:, None]] * gates[..., None]
    order = torch.rand(n, mc.top_k, generator=call.gen).argsort(-1)
    y = y.gather(1, order[..., None].expand_as(y))
    out = y[:, 0]
    for j in range(1, mc.top_k):
        out = out + y[:, j]
    return out, torch.log_softmax(logits, -1), selected

torch.set_num_threads(1)
ORIG = ie.InferenceEngine._layer_moe
for layers in (2, 8):
    ov = ["inference.router_noise_sigma=0", f"model.n_layers={layers}"]
    res = {}
    for patched in (False, True):
        ie.InferenceEngine._layer_moe = layer_moe if patched else ORIG
        moe = probe(load(ov))
        dense = probe(load(ov + ["model=dense_tiny"]))
        print(f"L{layers} expert split-K={patched}: moe var {moe.var_rollout:.2e} diff {moe.diff:.4f} | dense var {dense.var_rollout:.2e} | ratio {moe.var_rollout / dense.var_rollout:.1f}", flush=True)
