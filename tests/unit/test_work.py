"""How batches are dealt to processes: by stored pair counts, by counted pairs for a
set small enough to count, by atoms beyond that; the same on every rank."""

from __future__ import annotations

import numpy as np
import torch

from atomtrain.data import FrameSet, TargetKeys, read_structures
from atomtrain.data import neighbors as neighbors_module
from atomtrain.data.neighbors import compute_neighbor_list
from atomtrain.training import work as work_module

from conftest import RESOURCES


class TwoRanks:
    """Rank 0 of two, whose peer counted nothing: the all-reduce returns rank 0's sums
    plus the other half, computed here the same way."""

    rank, world_size = 0, 2

    def __init__(self, structures: FrameSet, cutoff: float):
        self.other = torch.zeros(len(structures), dtype=torch.int64)
        for position in range(1, len(structures), 2):
            frames, index = structures.locate(position)
            self.other[position] = frames.neighbors(index, cutoff).n_pairs

    def all_reduce_sum(self, tensor):
        return tensor.add_(self.other)


def counted(structures, cutoff):
    return [
        compute_neighbor_list(s.positions.numpy(), s.cell.numpy(), s.pbc.numpy(), cutoff).n_pairs
        for s in structures
    ]


def test_a_small_set_is_dealt_by_its_pairs_counted_in_shares():
    structures = (
        read_structures(RESOURCES / "ethanol_40.xyz")[:6]
        + read_structures(RESOURCES / "si_test.xyz")[:5]
    )
    work = work_module.work(structures, 4.0, TwoRanks(structures, 4.0))
    assert work.tolist() == counted(structures, 4.0)


def test_a_large_set_without_stored_counts_is_dealt_by_atoms(monkeypatch):
    structures = read_structures(RESOURCES / "si_test.xyz")
    monkeypatch.setattr(work_module, "COUNTED_UP_TO_ATOMS", 100)
    work = work_module.work(structures, 4.0, TwoRanks(structures[:0], 4.0))
    assert np.array_equal(work, structures.atom_counts)


def test_stored_counts_need_no_neighbor_search(tmp_path, monkeypatch):
    from atomtrain.cli.main import main

    source = RESOURCES / "si_test.xyz"
    assert main(["convert", str(source), "-o", str(tmp_path / "si"), "--cutoff", "4.0"]) == 0
    structures = read_structures(tmp_path / "si")
    monkeypatch.setattr(work_module, "COUNTED_UP_TO_ATOMS", 100)

    def no_search(*arguments):
        raise AssertionError("a neighbor search despite stored counts")

    monkeypatch.setattr(neighbors_module, "compute_neighbor_list", no_search)
    work = work_module.work(structures, 4.0, TwoRanks(structures[:0], 4.0))
    monkeypatch.undo()
    assert work.tolist() == counted(read_structures(source), 4.0)


def test_the_choice_is_kept_on_the_set_for_the_next_validation(monkeypatch, caplog):
    structures = read_structures(RESOURCES / "si_test.xyz")
    monkeypatch.setattr(work_module, "COUNTED_UP_TO_ATOMS", 10)
    with caplog.at_level("INFO", logger="atomtrain"):
        first = work_module.work(structures, 4.0, TwoRanks(structures[:0], 4.0))
        again = work_module.work(structures, 4.0, TwoRanks(structures[:0], 4.0))
    assert again is first
    assert sum("by atom counts" in record.message for record in caplog.records) == 1


def test_the_mean_neighbor_count_of_a_large_set_comes_from_a_fixed_sample(monkeypatch):
    """Beyond AVERAGE_NEIGHBORS_SAMPLE structures (here 30 of 100), the mean neighbor
    count is that of a fixed sample: the same on every call and every rank count, and
    of the whole set when it is small enough or its pair counts are stored."""
    structures = read_structures(RESOURCES / "qm9_reduced_100.xyz", TargetKeys(energy="U0"))
    whole = np.array(counted(structures, 3.0))
    mean_of_all = whole.sum() / structures.atom_counts.sum()

    class OneRank:
        rank, world_size = 0, 1

        def all_reduce_sum(self, tensor):
            return tensor

    assert work_module.average_neighbors(structures, 3.0, OneRank()) == mean_of_all
    monkeypatch.setattr(work_module, "AVERAGE_NEIGHBORS_SAMPLE", 30)
    fresh = read_structures(RESOURCES / "qm9_reduced_100.xyz", TargetKeys(energy="U0"))
    sampled = work_module.average_neighbors(fresh, 3.0, OneRank())
    chosen = np.sort(np.random.default_rng(0).choice(100, 30, replace=False))
    assert sampled == whole[chosen].sum() / fresh.atom_counts[chosen].sum()
    assert sampled != mean_of_all
    two = work_module.average_neighbors(fresh, 3.0, TwoRanks(fresh.subset(chosen), 3.0))
    assert two == sampled
