"""atomtrain convert: data files streamed into a memory-mapped directory that trains
like the files (exactly, with --float64), in metatrain's layout, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from ase.calculators.singlepoint import SinglePointCalculator

from atomtrain.cli.main import main
from atomtrain.data import read_structures
from atomtrain.data.layout import MANIFEST
from atomtrain.data.neighbors import compute_neighbor_list

from conftest import RESOURCES
from helpers import checkpoint_weights, children_of, finish, start_ranks, write_options


def convert(*arguments) -> int:
    return main(["convert", *map(str, arguments)])


def test_float64_directory_trains_the_model_of_the_file(tmp_path, fixed_threads):
    """To 1e-10 at a fixed thread count (fixed_threads): a busy machine's would differ
    between the two runs."""
    assert convert(RESOURCES / "ethanol_40.xyz", "-o", tmp_path / "ethanol", "--float64") == 0
    states = []
    for source in (tmp_path / "ethanol", RESOURCES / "ethanol_40.xyz"):
        directory = tmp_path / f"from_{source.name}"
        directory.mkdir()
        options = write_options(directory, source)
        assert main(["train", str(options), "--run-dir", str(directory / "run")]) == 0
        states.append(checkpoint_weights(directory / "run" / "best.ckpt"))
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=0, atol=1e-10)


def test_the_directory_is_metatrains_layout(tmp_path):
    """Read with numpy as metatrain's docs describe it; atomtrain's additions beside."""
    frames = ase.io.read(RESOURCES / "si_test.xyz", ":")
    assert convert(RESOURCES / "si_test.xyz", "-o", tmp_path / "si") == 0
    directory = tmp_path / "si"
    count = int(np.load(directory / "ns.npy"))
    offsets = np.load(directory / "na.npy")
    assert count == len(frames) and offsets.dtype == np.int64
    assert list(np.diff(offsets)) == [len(frame) for frame in frames]
    positions = np.fromfile(directory / "x.bin", dtype=np.float32).reshape(-1, 3)
    np.testing.assert_allclose(positions, np.concatenate([f.positions for f in frames]), atol=1e-5)
    numbers = np.fromfile(directory / "a.bin", dtype=np.int32)
    assert list(numbers) == list(np.concatenate([f.numbers for f in frames]))
    cells = np.fromfile(directory / "c.bin", dtype=np.float32).reshape(count, 3, 3)
    np.testing.assert_allclose(cells, [f.cell.array for f in frames], atol=1e-5)
    energy = np.fromfile(directory / "energy.bin", dtype=np.float32).reshape(count, 1)
    np.testing.assert_allclose(energy[:, 0], [f.get_potential_energy() for f in frames], rtol=1e-6)
    forces = np.fromfile(directory / "forces.bin", dtype=np.float32).reshape(-1, 3, 1)
    np.testing.assert_allclose(
        forces[:, :, 0], np.concatenate([f.get_forces() for f in frames]), atol=1e-5
    )
    stress = np.fromfile(directory / "stress.bin", dtype=np.float32).reshape(count, 3, 3, 1)
    expected = [f.get_stress(voigt=False) for f in frames]
    np.testing.assert_allclose(stress[..., 0], expected, atol=1e-7)
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["structures"] == count and manifest["keys"] == {
        "energy": "energy",
        "forces": "forces",
        "stress": "stress",
    }
    assert set(manifest["files"]) >= {"x.bin", "a.bin", "c.bin", "energy.bin", "stress.bin"}
    source = RESOURCES / "si_test.xyz"
    (record,) = manifest["sources"]
    assert record["frames"] == count
    assert record["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    structures = read_structures(directory)
    assert all(structure.pbc.all() for structure in structures)
    assert structures[3].stress is not None


def test_a_molecule_keeps_its_missing_cell_and_a_yaml_section_sets_keys(tmp_path):
    """A YAML data section (eval's format) chooses keys and units; non-periodic
    molecules keep pbc false and no stress, from atomtrain's pbc and known files."""
    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", ":5")
    for frame in frames:
        frame.info["my_energy"] = frame.get_potential_energy() * 1000  # in meV
        frame.arrays["my_forces"] = frame.get_forces() * 1000
        frame.calc = None
    ase.io.write(tmp_path / "renamed.xyz", frames)
    section = {
        "systems": {"read_from": str(tmp_path / "renamed.xyz")},
        "targets": {"energy": {"key": "my_energy", "unit": "meV", "forces": "my_forces"}},
    }
    (tmp_path / "data.yaml").write_text(json.dumps(section))
    assert convert(tmp_path / "data.yaml", "-o", tmp_path / "out") == 0
    structures = read_structures(tmp_path / "out")
    originals = read_structures(RESOURCES / "ethanol_40.xyz")[:5]
    for structure, original in zip(structures, originals):
        assert not structure.pbc.any() and structure.stress is None
        assert structure.energy == pytest.approx(original.energy, rel=1e-6)
        torch.testing.assert_close(structure.forces, original.forces, rtol=0, atol=1e-4)


TARGETS = {
    "energy": {"key": "energy"},
    "mtt::dipole": {"key": "dipole", "type": {"cartesian": {"rank": 1}}},
    "mtt::charges": {"key": "charges", "per_atom": True},
}


def with_other_targets(path, count=6):
    """Ethanol frames with a dipole (per structure) and charges (per atom)."""
    generator = np.random.default_rng(3)
    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", f":{count}")
    for frame in frames:
        frame.info["dipole"] = generator.normal(size=3)
        frame.arrays["charges"] = generator.normal(size=len(frame))
    ase.io.write(path, frames)
    return path


def section(path, targets=TARGETS) -> dict:
    return {"systems": {"read_from": str(path)}, "targets": targets}


def test_mtt_targets_are_converted_and_read_back(tmp_path):
    """Each mtt:: target goes to its <key>.bin, a row per structure (or atom), and the
    directory, read with the same section, gives the file's values (float32 kept, and
    float64 with --float64)."""
    from atomtrain.options import DatasetOptions
    from atomtrain.training.datasets import read_dataset

    data = with_other_targets(tmp_path / "targets.xyz")
    (tmp_path / "data.yaml").write_text(json.dumps(section(data)))
    assert convert(tmp_path / "data.yaml", "-o", tmp_path / "out", "--float64") == 0
    assert (tmp_path / "out" / "dipole.bin").stat().st_size == 6 * 3 * 4
    atoms = sum(len(frame) for frame in ase.io.read(data, ":"))
    assert (tmp_path / "out" / "charges.bin").stat().st_size == atoms * 4
    original = read_dataset(DatasetOptions.model_validate(section(data)))
    converted = read_dataset(DatasetOptions.model_validate(section(tmp_path / "out")))
    for name in ("mtt::dipole", "mtt::charges"):
        for ours, theirs in zip(converted, original):
            torch.testing.assert_close(ours.targets[name], theirs.targets[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    "targets, fragment",
    [
        ({"energy": {"key": "energy"}}, "differ from"),
        (
            {**TARGETS, "mtt::dipole": {"key": "forces", "type": {"cartesian": {"rank": 1}}}},
            "'forces'",
        ),
    ],
)
def test_targets_a_directory_cannot_hold_are_one_line(tmp_path, capsys, targets, fragment):
    data = with_other_targets(tmp_path / "targets.xyz")
    sections = [section(data), section(data, targets)]
    (tmp_path / "data.yaml").write_text(json.dumps(sections))
    assert convert(tmp_path / "data.yaml", "-o", tmp_path / "out") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert fragment in line and str(data) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("exists", ["out already exists", "remove it"]),
        ("nan", ["bad.xyz, frame 2", "NaN"]),
        ("newer", ["atomtrain.json", "format 'atomtrain-memmap-99'", "convert the data again"]),
        ("changed", ["x.bin changed since atomtrain convert", "convert the data again"]),
        ("units", ["stored this directory in angstrom and eV", "length_unit"]),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys, case, fragments):
    source = RESOURCES / "ethanol_40.xyz"
    if case == "exists":
        (tmp_path / "out").mkdir()
        code = convert(source, "-o", tmp_path / "out")
    elif case == "nan":
        frames = ase.io.read(source, ":4")
        frames[2].positions[1, 0] = np.nan
        ase.io.write(tmp_path / "bad.xyz", frames)
        code = convert(tmp_path / "bad.xyz", "-o", tmp_path / "out")
        # no output, and no partial directory left behind
        assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.xyz"]
    else:
        assert convert(source, "-o", tmp_path / "out") == 0
        manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
        data = str(tmp_path / "out")
        if case == "newer":
            manifest["format"] = "atomtrain-memmap-99"
            (tmp_path / "out" / MANIFEST).write_text(json.dumps(manifest))
        elif case == "changed":
            positions = bytearray((tmp_path / "out" / "x.bin").read_bytes())
            positions[5] ^= 0xFF
            (tmp_path / "out" / "x.bin").write_bytes(bytes(positions))
        else:
            section = {"systems": {"read_from": data, "length_unit": "bohr"}}
            (tmp_path / "data.yaml").write_text(json.dumps(section))
            data = str(tmp_path / "data.yaml")
        capsys.readouterr()
        code = main(["eval", str(RESOURCES / "old_export" / "model.pt"), data])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    for fragment in fragments:
        assert fragment in error


def test_two_processes_write_the_bytes_of_one(tmp_path):
    """Two files (molecules without stress, then periodic cells with it), shared out in
    contiguous frames: the joined directory is byte for byte the one-process one. The
    stored neighbor-pair counts are each structure's."""
    inputs = [RESOURCES / "ethanol_40.xyz", RESOURCES / "si_test.xyz"]
    extras = ["--float64", "--cutoff", "4.0"]
    assert convert(*inputs, "-o", tmp_path / "one", *extras) == 0
    assert convert(*inputs, "-o", tmp_path / "two", *extras, "--nproc", "2") == 0
    names = sorted(path.name for path in (tmp_path / "one").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "two").iterdir())
    assert "stress.bin" in names and "atomtrain_known.bin" in names
    assert "atomtrain_pairs_4.0.bin" in names
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    structures = read_structures(tmp_path / "two")
    assert len(structures) == 65
    assert structures[0].stress is None and structures[40].stress is not None
    stored = structures.stored_pair_counts(4.0)
    counted = [
        compute_neighbor_list(s.positions.numpy(), s.cell.numpy(), s.pbc.numpy(), 4.0).n_pairs
        for s in structures
    ]
    assert stored.tolist() == counted and min(counted) > 0
    assert structures.stored_pair_counts(5.0) is None


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """12,000 molecules: long enough (a few seconds) to be interrupted mid-way."""
    path = tmp_path_factory.mktemp("big") / "big.xyz"
    ase.io.write(path, ase.io.read(RESOURCES / "ethanol_40.xyz", ":") * 300)
    return path


def test_units_taken_in_turn_give_the_bytes_of_one_process(tmp_path, big_file):
    """12,000 molecules are 16 units for two processes (8 each), taken in turn: the
    joined directory is byte for byte the one-process one."""
    from atomtrain.data.convert import UNITS_PER_PROCESS, Source, plan

    units = plan([Source(big_file)], 2, UNITS_PER_PROCESS).shares
    assert len(units) == 16 and sum(share.stop - share.start for (share,) in units) == 12000
    assert convert(big_file, "-o", tmp_path / "one") == 0
    assert convert(big_file, "-o", tmp_path / "two", "--nproc", "2") == 0
    names = sorted(path.name for path in (tmp_path / "one").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_conversion(source: Path, output: Path, processes: int):
    """A conversion in its own process, returned once its workers write their units."""
    import subprocess
    import sys
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "atomtrain", "convert", str(source), "-o", str(output)]
        + ["--nproc", str(processes)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    pattern = f".{output.name}.partial-*/unit-*/x.bin"
    while time.monotonic() < deadline and process.poll() is None:
        written = [f for f in output.parent.glob(pattern) if f.stat().st_size]
        if len(written) >= processes:
            return process
        time.sleep(0.01)
    raise AssertionError("the conversion never started writing")


def wait_until_gone(pids: list[int], seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_killed_conversion_leaves_no_directory_that_looks_complete(tmp_path, big_file, processes):
    """SIGKILL gives no time to clean up: the staging directory stays, hidden and
    named partial, and the workers die with their parent."""
    import signal

    process = start_conversion(big_file, tmp_path / "out", processes)
    workers = children_of(process.pid)
    assert len(workers) == (processes if processes > 1 else 0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    # at once: a worker left running would finish its share (a second or more) first
    assert wait_until_gone(workers, seconds=0.5), "a worker outlived its killed parent"
    assert not (tmp_path / "out").exists()
    assert [path.name.startswith(".out.partial-") for path in tmp_path.glob(".out*")] == [True]
    # the leftover does not stand in the way of converting again
    assert convert(big_file, "-o", tmp_path / "out") == 0
    assert len(read_structures(tmp_path / "out")) == 12000


def test_a_stopped_conversion_removes_what_it_wrote_and_its_workers(tmp_path, big_file):
    """SIGTERM (a scheduler's stop) or Ctrl-C: one line, exit 75, nothing left."""
    import signal

    process = start_conversion(big_file, tmp_path / "out", 2)
    workers = children_of(process.pid)
    process.send_signal(signal.SIGTERM)
    _, error = process.communicate(timeout=60)
    assert process.returncode == 75
    assert error.strip() == (
        f"atomtrain: {tmp_path / 'out'}: conversion stopped by SIGTERM before it finished; "
        "nothing was written, run the command again"
    )
    assert wait_until_gone(workers)
    assert list(tmp_path.iterdir()) == []


def test_a_lost_worker_is_named_and_stops_the_conversion(tmp_path, big_file):
    """A worker killed from outside (the kernel's out-of-memory killer): the conversion
    says which and stops, instead of waiting for its share forever."""
    import signal

    process = start_conversion(big_file, tmp_path / "out", 2)
    workers = children_of(process.pid)
    os.kill(max(workers), signal.SIGKILL)
    _, error = process.communicate(timeout=60)
    assert process.returncode == 3
    assert len(error.strip().splitlines()) == 1
    assert "conversion process 1 ended without finishing its share (killed by SIGKILL)" in error
    assert wait_until_gone(workers)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_a_worker_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """ENOSPC while a worker writes unit 1 (the workers are forked, so they run the
    patched writer): the disk-full line, exit 2, no directory, no staging."""
    import errno

    from atomtrain.data import convert as conversion

    append = conversion.ArrayFiles.append

    def fill_the_disk(self, name, values, dtype):
        if self.directory.name == "unit-1":
            raise OSError(errno.ENOSPC, "No space left on device")
        append(self, name, values, dtype)

    monkeypatch.setattr(conversion.ArrayFiles, "append", fill_the_disk)
    code = convert(RESOURCES / "ethanol_40.xyz", "-o", tmp_path / "out", "--nproc", "2")
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("atomtrain: no space left on device while writing data directory")
    assert len(error.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_two_srun_tasks_write_the_bytes_of_one_process(tmp_path):
    """Launched as srun launches tasks (SLURM variables): each converts its share and
    rank 0 joins them; the same bytes as one process, and one line of output."""
    import sys

    inputs = [str(RESOURCES / "ethanol_40.xyz"), str(RESOURCES / "si_test.xyz")]
    assert convert(*inputs, "-o", tmp_path / "one") == 0
    command = [sys.executable, "-m", "atomtrain", "convert", *inputs, "-o", str(tmp_path / "two")]
    results = finish(start_ranks(command))
    assert [code for code, _, _ in results] == [0, 0], results
    assert "with 2 process(es)" in results[0][1] and results[1][1] == ""
    for file in (tmp_path / "one").iterdir():
        assert file.read_bytes() == (tmp_path / "two" / file.name).read_bytes(), file.name
    assert not list(tmp_path.glob(".two.partial-*"))


def test_a_bad_frame_in_one_tasks_share_stops_both_and_leaves_nothing(tmp_path):
    import sys

    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", ":")
    frames[30].positions[2, 1] = np.nan  # in rank 1's share (frames 20 to 39)
    ase.io.write(tmp_path / "bad.xyz", frames)
    command = [sys.executable, "-m", "atomtrain", "convert", str(tmp_path / "bad.xyz")]
    results = finish(start_ranks([*command, "-o", str(tmp_path / "out")]))
    (code_0, _, error_0), (code_1, _, error_1) = results
    assert code_1 == 2
    assert error_1.strip().endswith("frame 30: positions contains NaN or infinite values")
    assert code_0 == 3 and "rank 1" in error_0 and len(error_0.strip().splitlines()) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.xyz"]


def test_a_large_directory_is_verified_by_sizes_and_sampled_blocks(tmp_path, monkeypatch):
    """Beyond FULLY_VERIFIED_BYTES a start checks every file's size and sampled blocks
    (here 4 blocks of 16 bytes, a limit of 1 kB), so start-up does not grow with the
    data: a changed sampled byte or size is refused, a byte between samples is not
    read."""
    import logging

    from atomtrain.data import layout
    from atomtrain.errors import DataError

    monkeypatch.setattr(layout, "FULLY_VERIFIED_BYTES", 1000)
    monkeypatch.setattr(layout, "SAMPLED_BLOCKS", 4)
    monkeypatch.setattr(layout, "SAMPLED_BLOCK_BYTES", 16)
    assert convert(RESOURCES / "ethanol_40.xyz", "-o", tmp_path / "out") == 0
    positions = tmp_path / "out" / "x.bin"
    original = positions.read_bytes()
    assert len(original) == 40 * 9 * 12  # the samples start at 0, 1434, 2869, 4304
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    # a training run's logging setup stops propagation at the atomtrain logger
    logger = logging.getLogger(layout.__name__)
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert len(read_structures(tmp_path / "out")) == 40
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    (note,) = [record.getMessage() for record in records]
    assert "verified the size of every file and 4 sampled blocks" in note

    def changed(offset: int | None, extra: bytes = b"") -> bytes:
        data = bytearray(original)
        if offset is not None:
            data[offset] ^= 0xFF
        return bytes(data) + extra

    positions.write_bytes(changed(100))  # between samples
    assert len(read_structures(tmp_path / "out")) == 40
    for content in (changed(1440), changed(None, b"\0" * 12)):
        positions.write_bytes(content)
        with pytest.raises(DataError, match="x.bin changed since atomtrain convert"):
            read_structures(tmp_path / "out")


def test_a_directory_from_another_tool_converts_to_the_bytes_of_its_files(tmp_path, capsys):
    """metatrain's layout written with numpy (no pbc, known or manifest files), of
    molecules and periodic cells with stress: converted with two processes, its frames
    are checked on the way and the arrays are those of converting the xyz files; a
    directory atomtrain wrote is not converted again, and atoms on top of each other
    are named by frame."""
    from test_memmap import write_memmap

    molecules = ase.io.read(RESOURCES / "ethanol_40.xyz", ":")
    for atoms in molecules:  # no cell: metatrain's layout takes nonzero cells as periodic
        results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        atoms.set_cell(np.zeros((3, 3)))
        atoms.calc = SinglePointCalculator(atoms, **results)
    cells = ase.io.read(RESOURCES / "si_test.xyz", ":")
    for name, frames in (("molecules", molecules), ("cells", cells)):
        ase.io.write(tmp_path / f"{name}.xyz", frames)
        assert convert(tmp_path / f"{name}.xyz", "-o", tmp_path / f"{name}_from_xyz") == 0
        write_memmap(tmp_path / f"{name}_numpy", frames, stress=name == "cells")
        code = convert(
            tmp_path / f"{name}_numpy", "-o", tmp_path / f"{name}_from_dir", "--nproc", "2"
        )
        assert code == 0
        expected = {f.name: f.read_bytes() for f in (tmp_path / f"{name}_from_xyz").iterdir()}
        found = {f.name: f.read_bytes() for f in (tmp_path / f"{name}_from_dir").iterdir()}
        assert sorted(found) == sorted(expected)
        for file in sorted(set(expected) - {MANIFEST}):
            assert found[file] == expected[file], (name, file)
    assert convert(tmp_path / "cells_from_dir", "-o", tmp_path / "again") == 2
    assert "wrote this directory already" in capsys.readouterr().err
    positions = np.fromfile(tmp_path / "cells_numpy" / "x.bin", dtype=np.float32).reshape(-1, 3)
    first = sum(len(atoms) for atoms in cells[:20])  # in the second process's share
    positions[first + 5] = positions[first + 1]
    positions.tofile(tmp_path / "cells_numpy" / "x.bin")
    assert convert(tmp_path / "cells_numpy", "-o", tmp_path / "bad", "--nproc", "2") == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "cells_numpy, frame 20: atoms 1 and 5 are 0 A apart" in error
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.partial-*"))
