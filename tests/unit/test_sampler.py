"""Global batches and how they are dealt to ranks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from atomtrain.data.sampler import (
    BatchPlan,
    balanced_shard,
    epoch_order,
    global_batches,
    pack_by_atoms,
    pack_once,
    shard_by_work,
)


def test_epoch_order_is_a_seeded_permutation():
    first = epoch_order(50, seed=3, epoch=0).tolist()
    assert sorted(first) == list(range(50))
    assert first == epoch_order(50, seed=3, epoch=0).tolist()
    assert first != epoch_order(50, seed=3, epoch=1).tolist()
    batches = global_batches(first, 8)
    assert [len(batch) for batch in batches] == [8] * 6 + [2]
    assert sum(batches, []) == first


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_balanced_shards_partition_the_batch_and_even_out_atoms(world_size):
    generator = random.Random(world_size)
    for _ in range(50):
        items = generator.sample(range(1000), generator.randint(world_size, 16))
        sizes = [generator.randint(6, 95) for _ in items]
        parts = [balanced_shard(items, sizes, rank, world_size) for rank in range(world_size)]
        assert sorted(sum(parts, [])) == sorted(items)  # each item on exactly one rank
        for part in parts:
            assert part == [item for item in items if item in part]  # order kept
            assert part  # at least as many items as ranks: nobody idles
        size_of = dict(zip(items, sizes))
        loads = [sum(size_of[item] for item in part) for part in parts]
        # greedy largest-first: the spread is at most the largest item
        assert max(loads) - min(loads) <= max(sizes)


def test_one_rank_gets_the_batch_unchanged_and_short_batches_leave_ranks_empty():
    assert balanced_shard([5, 2, 9], [10, 30, 20], 0, 1) == [5, 2, 9]
    parts = [balanced_shard([7], [12], rank, 3) for rank in range(3)]
    assert parts == [[7], [], []]


def test_shard_by_work_deals_by_work_and_one_rank_takes_all():
    indices = [3, 1, 0, 2]
    work = [10, 64 * 40, 20, 10]  # the second structure outweighs the three others together
    assert shard_by_work(indices, work, 0, 1) == indices
    assert shard_by_work(indices, None, 0, 1) == indices
    parts = [shard_by_work(indices, work, rank, 2) for rank in range(2)]
    assert parts == [[1], [3, 0, 2]]


def test_packing_closes_a_batch_when_the_next_structure_would_pass_the_limit():
    atom_counts = [5, 9, 3, 12, 7, 1, 20, 4]
    order = [3, 0, 6, 1, 2, 5, 4, 7]
    batches = pack_by_atoms(order, atom_counts, max_atoms=15)
    # 12 | 5 | 20 (larger than the limit: alone, not dropped) | 9 3 1 | 7 4
    assert batches == [[3], [0], [6], [1, 2, 5], [4, 7]]
    # min_atoms leaves out the batch of 5 atoms, keeps the one of exactly 11
    assert pack_by_atoms(order, atom_counts, 15, min_atoms=11) == [[3], [6], [1, 2, 5], [4, 7]]


def test_packed_batches_are_fixed_and_presented_in_a_new_order_each_epoch():
    generator = random.Random(7)
    atom_counts = [generator.randint(6, 95) for _ in range(60)]
    packed = pack_once(atom_counts, seed=4, max_atoms=200)
    assert packed == pack_once(atom_counts, seed=4, max_atoms=200)
    assert packed != pack_once(atom_counts, seed=5, max_atoms=200)
    plan = BatchPlan(60, 8, 4, packed)
    assert sorted(sum(plan.packed, [])) == list(range(60))  # every structure, once
    epochs = [plan.batches(epoch) for epoch in range(3)]
    for batches in epochs:
        assert len(batches) == plan.steps_per_epoch == len(plan.packed)
        assert sorted(batches) == sorted(plan.packed)
        assert all(sum(atom_counts[index] for index in batch) <= 200 for batch in batches)
    assert epochs[0] != epochs[1] != epochs[2]


def test_fixed_size_plan_cuts_each_epoch_permutation():
    plan = BatchPlan(n_structures=50, batch_size=8, seed=3)
    assert plan.steps_per_epoch == 7
    for epoch in range(2):
        expected = global_batches(epoch_order(50, 3, epoch).tolist(), 8)
        assert [list(batch) for batch in plan.batches(epoch)] == expected


def test_epoch_fractions_give_each_part_its_share_every_epoch():
    from atomtrain.data.sampler import BatchPlan

    shares = ((0, 10, 2.0), (10, 20, 0.25), (30, 5, 1.0))
    plan = BatchPlan(35, 4, seed=7, shares=shares)
    assert plan.per_epoch == 20 + 5 + 5
    assert plan.steps_per_epoch == 8
    seen = []
    for epoch in range(3):
        order = np.concatenate([np.asarray(batch) for batch in plan.batches(epoch)])
        assert len(order) == 30
        counts = np.bincount(order, minlength=35)
        assert (counts[:10] == 2).all() and (counts[30:] == 1).all()
        assert counts[10:30].sum() == 5 and counts[10:30].max() == 1
        seen.append(frozenset(np.nonzero(counts[10:30])[0]))
        again = np.concatenate([np.asarray(batch) for batch in plan.batches(epoch)])
        assert np.array_equal(order, again)  # the same order for any process asking
    assert len(set(seen)) > 1  # another quarter each epoch


def test_fractions_of_one_keep_the_plain_order():
    from atomtrain.data.sampler import BatchPlan

    plain = BatchPlan(12, 5, seed=3)
    assert [list(b) for b in plain.batches(2)] == [
        list(b) for b in BatchPlan(12, 5, seed=3, shares=()).batches(2)
    ]
