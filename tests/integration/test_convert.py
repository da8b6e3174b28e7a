"""atomtrain convert: data files streamed into a memory-mapped directory that trains
like the files (exactly, with --float64), in metatrain's layout, written atomically."""

from __future__ import annotations

import hashlib
import json

import ase.io
import numpy as np
import pytest
import torch

from atomtrain.cli.main import main
from atomtrain.data import read_structures
from atomtrain.data.convert import MANIFEST
from atomtrain.data.neighbors import compute_neighbor_list

from conftest import RESOURCES
from helpers import checkpoint_weights, finish, start_ranks, write_options


def convert(*arguments) -> int:
    return main(["convert", *map(str, arguments)])


def test_float64_directory_trains_the_model_of_the_file(tmp_path):
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


def test_a_killed_conversion_leaves_no_directory_that_looks_complete(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", ":")
    ase.io.write(tmp_path / "big.xyz", frames * 100)
    process = subprocess.Popen(
        [sys.executable, "-m", "atomtrain", "convert", str(tmp_path / "big.xyz")]
        + ["-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    written = []
    while not written and time.monotonic() < deadline and process.poll() is None:
        written = [f for f in tmp_path.glob(".out.partial-*/part-0/x.bin") if f.stat().st_size]
        time.sleep(0.01)
    assert written, "the conversion never started writing"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "out").exists()
    assert [path.name.startswith(".out.partial-") for path in tmp_path.glob(".out*")] == [True]
    # the leftover does not stand in the way of converting again
    assert convert(tmp_path / "big.xyz", "-o", tmp_path / "out") == 0
    assert len(read_structures(tmp_path / "out")) == 4000


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
