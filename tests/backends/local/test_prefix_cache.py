"""The prefix cache between turns (harness/backends/local/prefix_cache.py): capacity and LRU eviction order, and
what eviction does to a multi-turn rollout (the rows that miss, their routing, replay coverage)."""
import dataclasses

import pytest
import torch

from harness.backends.local import prefix_cache
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import PolicyPack, build_policy
from harness.backends.local.prefix_cache import (MISSING, RECOMPUTED_OTHER, RECOMPUTED_SAME, SAMPLED, LRUCache,
                                                 turn_hits)
from harness.backends.local.tasks import Task
from harness.spec import load
from harness.tasks.vocab import CALL_END, PAD


def test_lru_evicts_least_recently_used_first_until_the_entry_fits():
    c = LRUCache(10)
    assert c.put("a", 4) == [] and c.put("b", 3) == [] and c.put("c", 3) == []
    assert c.used == 10
    assert c.get("a")  # a is now the most recently used: b is the oldest
    assert c.put("d", 5) == ["b", "c"]  # 10 - 3 - 3 + 5 = 9 <= 10: two evictions, in LRU order
    assert list(c.entries) == ["a", "d"] and c.used == 9
    assert not c.get("b") and "c" not in c
    assert c.evicted == ["b", "c"]


def test_lru_entry_larger_than_the_cache_is_never_kept():
    c = LRUCache(5)
    c.put("a", 2)
    assert c.put("big", 6) == ["a", "big"]
    assert c.used == 0 and not c.entries
    assert c.put("b", 5) == [] and c.used == 5  # exactly the capacity fits


def test_lru_refreshing_a_key_does_not_count_it_twice():
    c = LRUCache(6)
    c.put("a", 3)
    c.put("a", 3)
    assert c.used == 3 and list(c.entries) == ["a"]


def test_turn_hits_keeps_the_latest_finishers_that_fit():
    # one seed, 5 rows: context sizes and the decode step at which turn 1 finished
    sizes = torch.tensor([[6, 4, 5, 3, 2]])
    finish = torch.tensor([[3, 1, 3, 0, 4]])
    # total 20; share 0.5 -> 10 tokens. Insertion (LRU) order by (finish, row): 3, 1, 0, 2, 4.
    # 3 (3) 1 (7) 0 (13 > 10: evict 3 -> 10) 2 (15: evict 1 -> 11, evict 0 -> 5) 4 (7): rows 2 and 4 stay
    assert turn_hits(sizes, finish, 0.5).tolist() == [[False, False, True, False, True]]
    assert turn_hits(sizes, finish, 1.0).all()
    assert not turn_hits(sizes, finish, 0.0).any()
    # 0.95 -> 19 tokens: 3, 1, 0, 2 = 18; + 4 = 20 > 19: evicts 3 (the first to finish)
    assert turn_hits(sizes, finish, 0.95).tolist() == [[True, True, True, False, True]]


def test_turn_hits_per_seed_each_seed_its_own_cache():
    sizes = torch.tensor([[2, 2, 2, 2], [1, 1, 1, 5]])
    finish = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    hits = turn_hits(sizes, finish, 0.5)  # capacities 4 and 4
    assert hits.tolist() == [[False, False, True, True], [True, True, True, False]]
    # a seed's hits do not depend on the other seed
    assert turn_hits(sizes[1:], finish[1:], 0.5).tolist() == hits[1:].tolist()


def test_turn_hits_ties_broken_by_row():
    sizes = torch.tensor([[1, 1, 1, 1]])
    finish = torch.zeros(1, 4, dtype=torch.long)
    assert turn_hits(sizes, finish, 0.5).tolist() == [[False, False, True, True]]


# ------------------------------------------------------------------ the cache in the engine's multi-turn rollout
@pytest.fixture(scope="module")
def lookup():
    cfg = load(["task=lookup"])  # the default engine: router noise 1.0, so a recomputation routes differently
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(12, torch.Generator().manual_seed(0))
    return cfg, policy, task, prompts


def _roll(lookup, capacity=1.0, mode="recompute", seed=0):
    cfg, policy, task, prompts = lookup
    icfg = dataclasses.replace(cfg.inference, prefix_cache_capacity=capacity, replay_on_miss=mode)
    eng = InferenceEngine(policy, icfg, seed=seed)
    return eng, task.rollout(eng, prompts)


def _context(task):
    """The positions the cache holds while the tool runs: the prompt and the call but its last token."""
    return task.prompt_len + task.spec.tool.call_len(task.cfg.length) - 1


def _misses(roll, task, capacity):
    """The rows that missed, by hand: sizes = non-PAD context tokens, LRU order = (turn-1 stop step, row)."""
    c, p = _context(task), task.prompt_len
    rows = []
    for b in range(roll.tokens.shape[0]):
        call = roll.tokens[b, p:p + task.spec.tool.call_len(task.cfg.length)].tolist()
        finish = call.index(CALL_END) if CALL_END in call else len(call) - 1
        rows.append((finish, b, sum(1 for x in roll.tokens[b, :c].tolist() if x != PAD)))
    budget, kept, used = int(capacity * sum(r[2] for r in rows)), [], 0
    for finish, b, size in sorted(rows):  # insert in LRU order, evict the oldest until it fits
        kept.append((b, size))
        used += size
        while used > budget:
            used -= kept.pop(0)[1]
    return sorted(set(range(len(rows))) - {b for b, _ in kept})


def test_full_cache_is_the_plain_multi_turn_path(lookup, monkeypatch):
    def never(*a, **k):
        raise AssertionError("a full cache never evicts nor refills")

    monkeypatch.setattr(prefix_cache, "between_turns", never)
    eng, roll = _roll(lookup, 1.0)
    assert (roll.routing_origin == SAMPLED).all()
    assert "refill" not in eng._calls  # no refill call was made


def test_eviction_changes_only_the_missed_rows(lookup):
    cfg, policy, task, prompts = lookup
    _, full = _roll(lookup, 1.0)
    _, part = _roll(lookup, 0.5)
    miss = _misses(full, task, 0.5)  # turn 1 is the same under any capacity: the context is sampled before the cache
    assert miss and len(miss) < prompts.shape[0]
    hit = [b for b in range(prompts.shape[0]) if b not in miss]
    for f in ("tokens", "logp", "mask", "routed_experts", "router_logp"):
        assert torch.equal(getattr(part, f)[hit], getattr(full, f)[hit]), f  # hits: bitwise the full cache's
    c = _context(task)
    assert torch.equal(part.tokens[:, :c], full.tokens[:, :c]) and torch.equal(part.logp[:, :c - task.prompt_len],
                                                                               full.logp[:, :c - task.prompt_len])
    origin = part.routing_origin
    assert (origin[hit] == SAMPLED).all() and (origin[miss][:, c:] == SAMPLED).all()
    assert ((origin[miss][:, :c] == RECOMPUTED_SAME) | (origin[miss][:, :c] == RECOMPUTED_OTHER)).all()
    # a recomputed position carries the refill's routing: other experts exactly where the origin says so
    differs = (part.routed_experts[miss][:, :c].sort(-1).values
               != full.routed_experts[miss][:, :c].sort(-1).values).any(-1).any(-1)
    assert torch.equal(differs, origin[miss][:, :c] == RECOMPUTED_OTHER) and differs.any()


def test_replay_on_miss_missing_gives_minus_one_exactly_at_evicted_positions(lookup):
    cfg, policy, task, prompts = lookup
    _, rec = _roll(lookup, 0.5, "recompute")
    _, mis = _roll(lookup, 0.5, "missing")
    for f in ("tokens", "logp", "mask"):  # the sampling does not depend on what the rollout records
        assert torch.equal(getattr(rec, f), getattr(mis, f)), f
    c, t = _context(task), prompts.shape[1] + task.response_len
    expect = torch.zeros(prompts.shape[0], t, dtype=torch.bool)
    expect[_misses(rec, task, 0.5), :c] = True
    expect[:, -1] = True  # the last position is never processed
    none = (mis.routed_experts == -1).all(-1).all(-1)
    assert torch.equal(none, expect)
    assert ((mis.routed_experts == -1).any(-1).any(-1) == none).all()  # all layers and slots, or none
    assert torch.equal(mis.routing_origin[:, :c] == MISSING, expect[:, :c])
    assert torch.equal(mis.routed_experts[~none], rec.routed_experts[~none])


def test_coverage_equals_a_hand_count(lookup):
    cfg, policy, task, prompts = lookup
    _, roll = _roll(lookup, 0.3)
    miss, c = _misses(roll, task, 0.3), _context(task)
    counted = evicted = 0
    for b, row in enumerate(roll.tokens.tolist()):
        for t, x in enumerate(row[:-1]):  # every processed position that is not padding
            if x != PAD:
                counted += 1
                evicted += b in miss and t < c
    cov, drift = prefix_cache.replay_coverage(roll.tokens[None], roll.routing_origin[None], PAD)
    assert cov.item() == pytest.approx(1 - evicted / counted, abs=1e-6) and cov.item() < 1
    other = sum(1 for b in miss for t in range(c) if roll.tokens[b, t] != PAD
                and roll.routing_origin[b, t] == RECOMPUTED_OTHER)
    assert drift.item() == pytest.approx(other / counted, abs=1e-6)


def test_replay_coverage_by_hand_on_a_made_up_batch():
    tokens = torch.tensor([[1, 2, PAD, 3, 4], [5, PAD, PAD, 6, 7]])
    origin = torch.tensor([[SAMPLED, RECOMPUTED_OTHER, RECOMPUTED_OTHER, SAMPLED, MISSING],
                           [RECOMPUTED_SAME, SAMPLED, MISSING, MISSING, SAMPLED]], dtype=torch.int8)
    # counted: row 0 positions 0, 1, 3 (2 is PAD, 4 is last); row 1 positions 0, 3 -> 5 positions
    # sampled: (0,0), (0,3) -> 2/5; recomputed other: (0,1) -> 1/5
    cov, drift = prefix_cache.replay_coverage(tokens[None], origin[None], PAD)
    assert cov.tolist() == pytest.approx([2 / 5]) and drift.tolist() == pytest.approx([1 / 5])


def test_a_seed_rollout_under_eviction_is_the_same_alone_or_in_a_pack(lookup):
    cfg, policy, task, prompts = lookup
    icfg = dataclasses.replace(cfg.inference, prefix_cache_capacity=0.5)
    other = build_policy(cfg.model, seed=1)
    pack = InferenceEngine(PolicyPack.of([other, policy]), icfg, [1, 0])
    packed = task.rollout(pack, torch.stack([prompts.flip(0), prompts]))
    alone = task.rollout(InferenceEngine(policy, icfg, 0), prompts)
    for f in ("tokens", "logp", "routed_experts", "router_logp", "routing_origin"):
        assert torch.equal(getattr(packed, f)[1], getattr(alone, f)), f


def test_training_engine_routes_missing_positions_with_its_own_top_k(lookup):
    from harness.backends.local import train_engine

    cfg, policy, task, prompts = lookup
    _, roll = _roll(lookup, 0.3, "missing")
    out = train_engine.forward(policy, roll.tokens, replay=roll.routed_experts)
    none = (roll.routed_experts == -1).all(-1).all(-1)
    none[:, -1] = False
    assert none.any()
    own = out.router_logits.topk(cfg.model.top_k, dim=-1).indices
    assert torch.equal(out.selected[none], own[none])  # the training router's own choice where nothing is replayed
    known = ~none
    known[:, -1] = False
    assert torch.equal(out.selected[known], roll.routed_experts[known])  # the replay everywhere else


@pytest.mark.parametrize("mode", ["recompute", "missing"])
def test_r3_under_partial_replay_coverage_trains_through_harness_run(tiny_overrides, mode):
    from mlflow.tracking import MlflowClient

    from harness import metrics as M
    from harness.run import execute

    cfg = load(tiny_overrides("task=lookup", "estimator=r3", "inference.prefix_cache_capacity=0.3",
                              f"inference.replay_on_miss={mode}", "task.warmstart.max_steps=3", steps=2, name=mode))
    assert cfg.signature != load(tiny_overrides("task=lookup", "estimator=r3")).signature
    summary = execute(cfg, progress=False)
    assert summary.status == "finished" and summary.steps_done == 2
    client = MlflowClient(cfg.tracking_uri)
    hist = {k: [m.value for m in sorted(client.get_metric_history(summary.run_id, k), key=lambda m: m.step)]
            for k in (M.MOE_REPLAY_COVERAGE, M.MOE_REPLAY_DRIFT, M.POLICY_LOSS, M.REWARD_MEAN)}
    assert all(len(v) == 2 for v in hist.values()), hist
    assert all(0 < c < 1 for c in hist[M.MOE_REPLAY_COVERAGE])  # part of the context was evicted every step
    assert all(abs(v) < float("inf") for v in hist[M.POLICY_LOSS])
    assert all((d == 0) == (mode == "missing") for d in hist[M.MOE_REPLAY_DRIFT])


def test_resume_under_eviction_is_exact():
    """The refill's generator is checkpointed with the others: a trainer restored from a state continues bitwise."""
    import copy

    from harness.backends.local.trainer import LocalTrainer

    cfg = load(["task=lookup", "estimator=r3", "inference.prefix_cache_capacity=0.3", "trainer.prompts_per_step=4",
                "trainer.group_size=4", "trainer.num_minibatches=2", "diagnostics.noise_sequences=4",
                "task.warmstart.max_steps=3"])
    a = LocalTrainer(cfg, torch.device("cpu"))
    a.run_step()
    state = copy.deepcopy(a.state_dict())
    want = [a.run_step() for _ in range(2)]
    b = LocalTrainer(cfg, torch.device("cpu"))
    b.load_state_dict(state)
    got = [b.run_step() for _ in range(2)]
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("time/") and k != "tokens/per_s"}  # noqa: E731
    assert [strip(m) for m in got] == [strip(m) for m in want]
    assert all(m["moe/replay_coverage"] < 1 for m in got)
