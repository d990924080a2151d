"""PackAdamW: torch's AdamW update per seed, a skipping seed untouched, a seed's update independent of its pack."""
import torch

from harness.backends.local.optim import PackAdamW


def _params(size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(size, 5, 3, generator=g), "b": torch.randn(size, 7, generator=g)}


def _grads(params: dict[str, torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=g)


def test_matches_torch_adamw_over_steps():
    ours = _params(1)
    ref = {k: v[0].clone().requires_grad_() for k, v in ours.items()}
    opt = PackAdamW(ours, lr=1e-2, weight_decay=0.1)
    topt = torch.optim.AdamW(list(ref.values()), lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(5):
        _grads(ours, step)
        for k, p in ref.items():
            p.grad = ours[k].grad[0].clone()
        opt.step(torch.tensor([True]))
        topt.step()
        for k in ours:  # torch uses lerp for the first moment: equal to rounding, not bitwise
            torch.testing.assert_close(ours[k][0], ref[k].detach(), rtol=1e-6, atol=1e-7)


def test_a_skipping_seed_keeps_its_parameters_and_moments_bitwise():
    params = _params(3)
    opt = PackAdamW(params, lr=1e-2)
    _grads(params, 0)
    opt.step(torch.tensor([True, True, True]))  # moments non-zero
    before = {k: (p.clone(), opt.m[k].clone(), opt.v[k].clone()) for k, p in params.items()}
    _grads(params, 1)
    opt.step(torch.tensor([True, False, True]))
    assert opt.t.tolist() == [2.0, 1.0, 2.0]
    for k, p in params.items():
        p0, m0, v0 = before[k]
        assert torch.equal(p[1], p0[1]) and torch.equal(opt.m[k][1], m0[1]) and torch.equal(opt.v[k][1], v0[1])
        assert not torch.equal(p[0], p0[0]) and not torch.equal(p[2], p0[2])


def test_a_seed_updates_bitwise_as_a_pack_of_one():
    pack = _params(3)
    alone = {k: v[2:3].clone() for k, v in pack.items()}
    opt_pack, opt_alone = PackAdamW(pack, lr=3e-3), PackAdamW(alone, lr=3e-3)
    for step in range(4):
        _grads(pack, step)
        for k in alone:
            alone[k].grad = pack[k].grad[2:3].clone()
        active = torch.tensor([True, step != 1, True])  # another seed skipping changes nothing for seed 2
        opt_pack.step(active)
        opt_alone.step(torch.tensor([True]))
    for k in pack:
        assert torch.equal(pack[k][2], alone[k][0])
        assert torch.equal(opt_pack.m[k][2], opt_alone.m[k][0]) and torch.equal(opt_pack.v[k][2], opt_alone.v[k][0])
