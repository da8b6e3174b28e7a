"""The data cache (data/remembered.py): a file read before gives the arrays and warnings
of its first reading without ASE, and any change to the file or to how it is read reads
it anew."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import ase
import ase.io
import numpy as np
import pytest

from atomtrain.data import TargetKeys, Units, read_structures, remembered
from atomtrain.targets import TargetSpec

from conftest import EXAMPLES, RESOURCES
from helpers import environment

SPECS = (
    TargetSpec("mtt::scalar", "s", "scalar", num_subtargets=2),
    TargetSpec("mtt::charges", "q", "scalar", per_atom=True),
)
KEYS = TargetKeys(others=SPECS, weight="w")
COLUMNS = ("offsets", "positions", "numbers", "cells", "pbc", "energy", "forces", "stress")
COLUMNS += ("energy_known", "forces_known", "stress_known", "weights")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(remembered.VARIABLE, str(folder))
    return folder


def rich_file(path, energy_shift=0.0):
    """Periodic frames with energy, forces, stress, a weight, a per-structure and a
    per-atom target; the second has two atoms 0.3 A apart (reading notes it)."""
    frames = []
    for index in range(3):
        atoms = ase.Atoms("SiSiC", positions=[[0, 0, 0], [1.5, 1.5, 1.5], [3, 0, 1.2]])
        atoms.cell, atoms.pbc = np.eye(3) * 5.0, True
        if index == 1:
            atoms.positions[2] = [1.5, 1.5, 1.8]
        atoms.info.update(energy=-10.0 - index + energy_shift, w=0.5 + index, s=[index, 2.0])
        atoms.info["stress"] = np.arange(9.0).reshape(3, 3) * 0.01 * (index + 1)
        atoms.arrays["forces"] = np.full((3, 3), 0.1 * index)
        atoms.arrays["q"] = np.array([0.1, -0.2, 0.1]) * index
        frames.append(atoms)
    ase.io.write(path, frames, format="extxyz")
    return path


def assert_same_frames(found, expected):
    for name in COLUMNS:
        first, second = getattr(found, name), getattr(expected, name)
        assert (first is None) == (second is None), name
        if first is not None:
            assert first.dtype == second.dtype and first.shape == second.shape, name
            assert np.array_equal(first, second, equal_nan=True), name
    assert list(found.targets) == list(expected.targets)
    for name, column in expected.targets.items():
        assert found.targets[name].per_atom == column.per_atom
        assert np.array_equal(found.targets[name].values, column.values)
        assert np.array_equal(found.targets[name].known, column.known)


def test_a_file_read_again_gives_the_first_readings_arrays_and_warnings(tmp_path, cache, caplog):
    path = rich_file(tmp_path / "rich.xyz")

    def notes():
        return [record.getMessage() for record in caplog.records if "closer" in record.msg]

    with caplog.at_level(logging.DEBUG, logger="atomtrain"):
        first = read_structures(path, KEYS).parts[0]
        note = notes()
        caplog.clear()
        again = read_structures(path, KEYS).parts[0]
    assert len(list(cache.glob("*.npz"))) == 1
    assert_same_frames(again, first)
    assert again.source == str(path) and set(first.targets) == {"mtt::scalar", "mtt::charges"}
    assert len(note) == 1 and notes() == note
    assert any("3 structures as read before" in record.msg for record in caplog.records)


def test_a_file_read_before_is_read_without_importing_ases_readers(tmp_path, cache):
    path = rich_file(tmp_path / "rich.xyz")
    read_structures(path)
    probe = (
        "import sys\nfrom atomtrain.data import read_structures\n"
        f"frames = read_structures({str(path)!r})\n"
        "print(len(frames), 'ase.io' in sys.modules)"
    )
    result = run_with_cache(probe, cache)
    assert result.stdout.split() == ["3", "False"]


def test_a_changed_file_other_keys_or_other_units_are_read_anew(tmp_path, cache):
    path = rich_file(tmp_path / "rich.xyz")
    before = read_structures(path, KEYS).parts[0]
    rich_file(path, energy_shift=1.0)
    assert read_structures(path, KEYS).parts[0].energy == pytest.approx(before.energy + 1.0)
    in_bohr = read_structures(path, KEYS, Units(length="bohr")).parts[0]
    assert np.allclose(in_bohr.positions, before.positions * ase.units.Bohr)
    without = read_structures(path, TargetKeys(read_stress=False, weight="w")).parts[0]
    assert without.stress is None and not without.targets
    assert len(list(cache.glob("*.npz"))) == 4


def test_a_damaged_entry_is_read_anew_and_replaced(tmp_path, cache):
    path = rich_file(tmp_path / "rich.xyz")
    first = read_structures(path, KEYS).parts[0]
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])  # a disk that filled while writing
    assert_same_frames(read_structures(path, KEYS).parts[0], first)
    assert_same_frames(remembered.load_entry(entry, str(path))[0], first)


def test_off_keeps_nothing_and_an_unwritable_cache_only_costs_a_reading(tmp_path, monkeypatch):
    path = rich_file(tmp_path / "rich.xyz")
    monkeypatch.setenv(remembered.VARIABLE, "off")
    assert remembered.cache_folder() is None
    assert len(read_structures(path, KEYS)) == 3
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv(remembered.VARIABLE, str(blocked / "cache"))
    assert len(read_structures(path, KEYS)) == 3


def test_the_least_recently_used_entries_go_beyond_the_budget(cache, monkeypatch):
    entries = []
    for name in ("ethanol_40.xyz", "tio2_30.xyz", "si_test.xyz"):
        read_structures(RESOURCES / name)
        (entry,) = set(cache.glob("*.npz")) - set(entries)
        entries.append(entry)
    for entry, used in zip(entries, (1000, 3000, 2000)):
        os.utime(entry, (used, used))
    read_structures(RESOURCES / "ethanol_40.xyz")  # used now: then tio2, last si_test
    kept = entries[:2]
    monkeypatch.setattr(remembered, "BUDGET", sum(entry.stat().st_size for entry in kept))
    stale, fresh = cache / "killed.partial", cache / "being written.partial"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1, 1))
    remembered.keep_within_budget(cache)
    assert sorted(cache.glob("*.npz")) == sorted(kept)
    assert fresh.exists() and not stale.exists()


def test_a_file_not_read_before_is_read_by_a_child_while_the_command_imports(
    tmp_path, cache, monkeypatch
):
    """data/ahead.py: the command hands the file to a child as it starts; its own reading
    then finds the child's entry, and imports no ASE reader (the child did, without
    torch), with the arrays and the warnings of a reading of its own."""
    path = rich_file(tmp_path / "rich.xyz")
    probe = (
        "import sys\nfrom pathlib import Path\n"
        "from atomtrain.data.ahead import read_ahead\n"
        "from atomtrain.data import TargetKeys, Units\n"
        "from atomtrain.targets import TargetSpec\n"
        f"keys = {KEYS!r}\n"
        f"read_ahead([(Path({str(path)!r}), keys, Units())])\n"
        "print('torch' in sys.modules)\n"
        "from atomtrain.data import read_structures\n"
        f"frames = read_structures({str(path)!r}, keys)\n"
        "print(len(frames), 'ase.io' in sys.modules)"
    )
    result = run_with_cache(probe, cache)
    assert result.stdout.split() == ["False", "3", "False"]
    assert "1 structure(s) have atoms closer than" in result.stderr  # given again
    assert len(list(cache.glob("*.npz"))) == 1
    kept = read_structures(path, KEYS).parts[0]
    monkeypatch.setenv(remembered.VARIABLE, "off")
    assert_same_frames(kept, read_structures(path, KEYS).parts[0])


def test_a_file_the_child_cannot_read_is_read_and_named_by_the_command(
    tmp_path, cache, monkeypatch
):
    from atomtrain.data.ahead import read_ahead
    from atomtrain.errors import DataError

    forget_earlier_readings(monkeypatch)
    path = rich_file(tmp_path / "rich.xyz")
    lines = path.read_text().splitlines(keepends=True)
    lines[7] = lines[7].replace("0.00000000", "abc", 1)  # frame 1's first atom
    path.write_text("".join(lines))
    read_ahead([(path, KEYS, Units())])
    assert remembered.ReadElsewhere.process is not None
    with pytest.raises(DataError, match=r"rich.xyz, frame 1 \(line 8\).*'abc'"):
        read_structures(path, KEYS)
    assert remembered.ReadElsewhere.process.returncode != 0
    assert not list(cache.glob("*.npz"))


def run_with_cache(script: str, cache, check: bool = True) -> subprocess.CompletedProcess:
    """``script`` in a Python process of its own, with the data cache in ``cache``."""
    env = {**environment(), remembered.VARIABLE: str(cache)}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=check
    )


def test_a_command_that_ends_before_its_reading_leaves_no_reader_behind(tmp_path, cache):
    """The child dies with the command (an options mistake found after the imports, a
    scheduler's kill): it does not parse a large file for nobody."""
    frames = ase.io.read(EXAMPLES / "ethanol" / "ethanol_1000.xyz", ":")
    path = tmp_path / "large.xyz"
    ase.io.write(path, frames * 8)  # seconds of parsing
    probe = (
        "import os\nfrom pathlib import Path\n"
        "from atomtrain.data import TargetKeys, Units, remembered\n"
        "from atomtrain.data.ahead import read_ahead\n"
        f"read_ahead([(Path({str(path)!r}), TargetKeys(), Units())])\n"
        "print(remembered.ReadElsewhere.process.pid, flush=True)\n"
        "import time; time.sleep(1.0)\n"  # the child is reading by now
        "os._exit(2)\n"
    )
    child = int(run_with_cache(probe, cache, check=False).stdout)
    deadline = time.monotonic() + 2.0
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")
    assert not list(cache.glob("*.npz"))


def test_a_file_read_before_is_hashed_once_for_the_command_and_read_by_no_child(
    tmp_path, cache, monkeypatch
):
    from atomtrain.data.ahead import read_ahead

    forget_earlier_readings(monkeypatch)
    path = rich_file(tmp_path / "rich.xyz")
    first = read_structures(path, KEYS).parts[0]
    hashed = []
    entry_name = remembered.entry_name
    monkeypatch.setattr(
        remembered, "entry_name", lambda *reading: hashed.append(reading) or entry_name(*reading)
    )
    read_ahead([(path, KEYS, Units())])
    assert remembered.ReadElsewhere.process is None  # nothing to read
    assert_same_frames(read_structures(path, KEYS).parts[0], first)
    assert len(hashed) == 1


def forget_earlier_readings(monkeypatch) -> None:
    """No names or child of another test's read_ahead in this process (restored after)."""
    monkeypatch.setattr(remembered.ReadElsewhere, "names", {})
    monkeypatch.setattr(remembered.ReadElsewhere, "process", None)
    monkeypatch.setattr(remembered.ReadElsewhere, "written", frozenset())


def test_the_nproc_launcher_reads_ahead_and_starts_its_processes_once_the_files_are_kept(
    tmp_path, cache, monkeypatch
):
    """``--nproc N``: the launcher hands a file not read before to the child, as one
    process does, and starts its processes after the child has kept it: each then loads
    the entry instead of all parsing the file at once."""
    import shutil

    from atomtrain import runtime
    from atomtrain.cli import train_run
    from atomtrain.cli.main import main

    from helpers import write_options

    forget_earlier_readings(monkeypatch)
    monkeypatch.setattr(runtime._Process, "runs_one_command", True)  # as the command line
    data = tmp_path / "ethanol.xyz"
    shutil.copy(RESOURCES / "ethanol_40.xyz", data)
    options = write_options(tmp_path, data)
    found = []

    def launch_workers(*_):
        found.append(sorted(path.name for path in cache.glob("*.npz")))
        return 0

    monkeypatch.setattr(train_run, "launch_workers", launch_workers)
    code = main(["train", str(options), "--nproc", "2", "--outputs", str(tmp_path / "out")])
    assert code == 0
    assert remembered.ReadElsewhere.process is not None
    assert found == [[remembered.ReadElsewhere.names[(str(data), TargetKeys(), Units())]]]
