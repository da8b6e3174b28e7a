"""split.yaml is written by a fast emitter of its own: it must read back as the split."""

from __future__ import annotations

import yaml

from atomtrain.training.outputs import split_text


def test_the_split_reads_back_as_written_for_one_file_and_for_several():
    one = {"training": [3, 1, 2], "validation": [], "test": [0]}
    several = [
        {"file": "/data/a b: c.xyz", "training": [1, 2], "validation": [0], "test": []},
        {"file": 'odd "name"\\.xyz', "training": [0], "validation": [], "test": []},
    ]
    for split in (one, several):
        assert yaml.safe_load(split_text(split)) == split


def test_many_indices_take_one_line_per_part():
    split = {"training": list(range(100_000)), "validation": [5], "test": []}
    text = split_text(split)
    assert text.count("\n") == 3
    assert yaml.safe_load(text)["training"][-1] == 99_999
