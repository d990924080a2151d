"""The prefix cache between turns (harness/backends/local/prefix_cache.py): capacity and LRU eviction order."""
import torch

from harness.backends.local.prefix_cache import LRUCache, turn_hits


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
