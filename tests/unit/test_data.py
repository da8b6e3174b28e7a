"""Reading extended XYZ: keys, units, all bundled data sets, and each bad-data error."""

from __future__ import annotations

import logging

import ase.io
import ase.units
import numpy as np
import pytest
import torch

from atomtrain.data import TargetKeys, Units, read_structures
from atomtrain.errors import DataError

from conftest import EXAMPLES, RESOURCES

ALL_FILES = {
    # path: (frames, has forces, has stress, keys)
    RESOURCES / "ethanol_reduced_100.xyz": (100, True, False, {}),
    RESOURCES / "qm9_reduced_100.xyz": (100, False, False, {"energy": "U0"}),
    RESOURCES / "carbon_reduced_100.xyz": (100, True, True, {"forces": "force"}),  # virial
    RESOURCES / "si_test.xyz": (25, True, True, {}),
    RESOURCES / "ethanol_40.xyz": (40, True, False, {}),
    RESOURCES / "tio2_30.xyz": (30, True, False, {}),
    EXAMPLES / "ethanol" / "ethanol_1000.xyz": (1000, True, False, {}),
    EXAMPLES / "silicon" / "si_train.xyz": (214, True, True, {}),
    EXAMPLES / "silicon" / "si_test.xyz": (25, True, True, {}),
    EXAMPLES / "tio2" / "tio2_1000.xyz": (1000, True, False, {}),
}


@pytest.mark.parametrize("path", list(ALL_FILES), ids=lambda p: p.name)
def test_every_bundled_file_reads(path):
    frames, forces, stress, keys = ALL_FILES[path]
    structures = read_structures(path, TargetKeys(**keys))
    assert len(structures) == frames
    for structure in structures:
        assert structure.energy is not None and np.isfinite(structure.energy)
        assert (structure.forces is not None) == forces
        assert (structure.stress is not None) == stress
        if forces:
            assert structure.forces.shape == (structure.n_atoms, 3)
        if stress:
            assert structure.stress.shape == (3, 3)
            assert torch.allclose(structure.stress, structure.stress.T)


def test_targets_set_to_false_are_left_out():
    """``forces: false`` trains on energies only, even where the file has forces."""
    path = RESOURCES / "si_test.xyz"
    structures = read_structures(path, TargetKeys(read_forces=False, read_stress=False))
    assert all(s.forces is None and s.stress is None for s in structures)
    assert all(s.forces is not None for s in read_structures(path, TargetKeys(read_stress=False)))


def test_units_are_converted_through_ase():
    path = RESOURCES / "ethanol_reduced_100.xyz"
    raw = read_structures(path)
    converted = read_structures(path, units=Units(energy="kcal/mol"))
    factor = ase.units.kcal / ase.units.mol
    assert converted[0].energy == pytest.approx(raw[0].energy * factor)
    assert torch.allclose(converted[0].forces, raw[0].forces * factor)
    in_bohr = read_structures(path, units=Units(length="bohr", energy="hartree"))
    assert torch.allclose(in_bohr[0].positions, raw[0].positions * ase.units.Bohr)
    assert torch.allclose(in_bohr[0].forces, raw[0].forces * ase.units.Hartree / ase.units.Bohr)


def test_unknown_unit_is_a_clear_error():
    with pytest.raises(DataError, match="unknown energy unit 'kelvin'"):
        read_structures(RESOURCES / "si_test.xyz", units=Units(energy="kelvin"))


def write(tmp_path, text, name="data.xyz"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD_FRAME = (
    '2\nProperties=species:S:1:pos:R:3:forces:R:3 energy=-1.5 pbc="F F F"\n'
    "H 0 0 0 0.1 0.2 0.3\nH 0 0 0.7 -0.1 -0.2 -0.3\n"
)


def test_stress_as_voigt_or_matrix_and_virial(tmp_path):
    cell = 'Lattice="3 0 0 0 3 0 0 0 3" pbc="T T T"'
    matrix = "1 4 5 4 2 6 5 6 3"
    header = "Properties=species:S:1:pos:R:3 energy=-1.0"
    full = read_structures(write(tmp_path, f'1\n{header} {cell} stress="{matrix}"\nSi 0 0 0\n'))
    # ASE's extxyz reader insists on 9 values under 'stress'; Voigt comes under other keys
    voigt = read_structures(
        write(tmp_path, f'1\n{header} {cell} sigma="1 2 3 6 5 4"\nSi 0 0 0\n', "v.xyz"),
        TargetKeys(stress="sigma"),
    )
    virial = read_structures(
        write(tmp_path, f'1\n{header} {cell} virial="{matrix}"\nSi 0 0 0\n', "w.xyz")
    )
    expected = torch.tensor([[1.0, 4, 5], [4, 2, 6], [5, 6, 3]], dtype=torch.float64)
    assert torch.allclose(full[0].stress, expected)
    assert torch.allclose(voigt[0].stress, expected)
    assert torch.allclose(virial[0].stress, -expected / 27.0)


@pytest.mark.parametrize(
    "text, keys, message",
    [
        ("", {}, "holds no structure"),
        ("this is not\nan xyz file\n", {}, "cannot read as extended XYZ"),
        (
            GOOD_FRAME.replace("energy=-1.5", "free=-1.5"),
            {},
            r"frame 0: no energy under key 'energy'; keys present: .*free",
        ),
        (
            GOOD_FRAME,
            {"forces": "force", "read_forces": True},
            r"frame 0: no forces under key 'force'; keys present: .*forces",
        ),
        (GOOD_FRAME.replace("energy=-1.5", "energy=nan"), {}, "energy 'energy' contains NaN"),
        (GOOD_FRAME.replace("0.1 0.2 0.3", "inf 0.2 0.3"), {}, "forces 'forces' contains NaN"),
        (
            GOOD_FRAME.replace("forces:R:3", "forces:R:2")
            .replace(" 0.3\n", "\n")
            .replace(" -0.3\n", "\n"),
            {},
            r"forces 'forces' have shape \(2, 2\), expected \(2, 3\)",
        ),
        (
            GOOD_FRAME.replace('pbc="F F F"', 'Lattice="1 0 0 2 0 0 0 0 1" pbc="T T T"'),
            {},
            "periodic but its cell has zero volume",
        ),
        (
            GOOD_FRAME
            + GOOD_FRAME.replace("energy=-1.5", "energy=-1.5 ")
            .replace("Properties=species:S:1:pos:R:3:forces:R:3", "Properties=species:S:1:pos:R:3")
            .replace(" 0.1 0.2 0.3", "")
            .replace(" -0.1 -0.2 -0.3", ""),
            {},
            "frame 1: no forces under key 'forces'",
        ),
        (
            GOOD_FRAME + GOOD_FRAME.replace("0.1 0.2 0.3", "0.1 abc 0.3"),
            {},
            r"frame 1 \(line 7\): cannot read as extended XYZ \(.*'abc'\)",
        ),
        (
            GOOD_FRAME + "2\n",
            {},
            "frame 1 .line 5.: the file ends inside this frame, whose first line announces 2",
        ),
    ],
    ids=[
        "empty",
        "unreadable",
        "missing-energy",
        "missing-forces",
        "nan-energy",
        "infinite-forces",
        "forces-shape",
        "zero-volume",
        "forces-missing-in-later-frame",
        "a-word-among-numbers",
        "ends-after-a-count-line",
    ],
)
def test_bad_data_gives_one_clear_error(tmp_path, text, keys, message):
    path = write(tmp_path, text)
    with pytest.raises(DataError, match=message) as error:
        read_structures(path, TargetKeys(**keys))
    assert str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        read_structures(tmp_path / "nothing.xyz")


def test_energy_only_data_has_no_forces():
    structures = read_structures(RESOURCES / "qm9_reduced_100.xyz", TargetKeys(energy="U0"))
    assert all(structure.forces is None for structure in structures)


@pytest.mark.parametrize("suffix", [".traj", ".json", ".txt"])
def test_other_formats_ase_reads_give_the_same_structures(tmp_path, suffix):
    """ASE trajectories and databases (energies and forces as calculator results) read
    like the extended XYZ they came from; a file ASE cannot place is read as extended
    XYZ, as before."""
    source = RESOURCES / "ethanol_40.xyz"
    path = tmp_path / f"data{suffix}"
    frames = ase.io.read(source, ":5")
    ase.io.write(path, frames, format="extxyz" if suffix == ".txt" else None)
    expected = read_structures(source)[:5]
    structures = read_structures(path)
    assert len(structures) == 5
    for read, reference in zip(structures, expected):
        assert read.energy == pytest.approx(reference.energy, rel=1e-12)
        assert torch.allclose(read.forces, reference.forces)
        assert torch.allclose(read.positions, reference.positions)


def test_atoms_closer_than_a_bond_train_with_a_note_and_on_top_of_each_other_are_refused(
    tmp_path,
):
    frames = ase.io.read(RESOURCES / "si_test.xyz", ":4")
    # periodic images count: atom 5 moved onto the image of atom 2 across the cell
    frames[2].positions[5] = frames[2].positions[2] + frames[2].cell[0] + [0.3, 0.0, 0.0]
    ase.io.write(tmp_path / "close.xyz", frames)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    reader_logger = logging.getLogger("atomtrain.data.extxyz")
    reader_logger.addHandler(handler)
    try:
        structures = read_structures(tmp_path / "close.xyz")
    finally:
        reader_logger.removeHandler(handler)
    assert len(structures) == 4
    (note,) = [record.getMessage() for record in records]
    assert "1 structure(s) have atoms closer than 0.5 A" in note
    assert "frame 2, atoms 2 and 5, 0.3 A apart" in note
    frames[1].positions[7] = frames[1].positions[3]
    ase.io.write(tmp_path / "overlap.xyz", frames)
    with pytest.raises(DataError, match=r"overlap.xyz, frame 1: atoms 3 and 7 are 0 A apart"):
        read_structures(tmp_path / "overlap.xyz")


def test_a_share_read_by_chunk_offsets_is_the_files_frames(tmp_path):
    """Conversion reads each process's share of an extended XYZ file from byte offsets
    the survey found (every 64th frame): any share, across chunk boundaries, gives the
    frames ASE reads; a blank line inside the file is named by frame."""
    from atomtrain.data.convert import survey
    from atomtrain.data.extxyz import FRAMES_PER_CHUNK, iterate_frames

    frames = ase.io.read(EXAMPLES / "silicon" / "si_train.xyz", ":150")
    path = tmp_path / "si.xyz"
    ase.io.write(path, frames)
    count, _, offsets = survey(path)
    assert count == 150 and len(offsets) == -(-150 // FRAMES_PER_CHUNK) + 1
    for start, stop in [(0, 150), (0, 64), (63, 65), (64, 128), (70, 150), (149, 150)]:
        read = list(iterate_frames(path, start, stop, offsets))
        assert len(read) == stop - start
        for atoms, expected in zip(read, frames[start:stop]):
            np.testing.assert_array_equal(atoms.positions, expected.positions)
            np.testing.assert_array_equal(atoms.get_forces(), expected.get_forces())
            assert atoms.get_potential_energy() == expected.get_potential_energy()
    lines = path.read_text().splitlines(keepends=True)
    before = sum(len(atoms) + 2 for atoms in frames[:70])
    blank = tmp_path / "blank.xyz"
    blank.write_text("".join(lines[:before] + ["\n"] + lines[before:]))
    count, _, offsets = survey(blank)
    with pytest.raises(DataError, match="blank.xyz, frame 70: .*blank line"):
        list(iterate_frames(blank, 0, count, offsets))


def test_screening_small_molecules_for_close_atoms_keeps_every_close_pair():
    """A directory from another tool is checked for atoms on top of each other; small
    molecules are screened all pairs at once, and only those with a pair under the
    suspect distance (and every periodic or large structure) get the per-frame check:
    nothing the per-frame check would catch is missed."""
    from atomtrain.data.conventions import SUSPECT_DISTANCE
    from atomtrain.data.memmap import SCREENED_ATOMS, distance_candidates

    molecules = ase.io.read(RESOURCES / "qm9_reduced_100.xyz", ":60")
    molecules += ase.io.read(RESOURCES / "ethanol_40.xyz", ":")
    cells = ase.io.read(RESOURCES / "si_test.xyz", ":5")
    large = ase.Atoms("C60", positions=np.random.default_rng(0).normal(0, 8, (60, 3)))
    frames = molecules[:50] + cells + [large, ase.Atoms("H", positions=[[0, 0, 0]])]
    frames += molecules[50:]
    for index, gap in [(3, 0.05), (17, 0.4), (70, 0.49), (90, 0.02)]:
        frames[index].positions[1] = frames[index].positions[0] + [gap, 0, 0]
    frames[40].positions[2] = frames[40].positions[1] + [0.52, 0, 0]  # not suspect
    structures = read_structures_of(frames)
    expected = [
        index
        for index, atoms in enumerate(frames)
        if len(atoms) > 1
        and (
            atoms.pbc.any()
            or len(atoms) > SCREENED_ATOMS
            or min(atoms.get_all_distances()[np.triu_indices(len(atoms), 1)]) < SUSPECT_DISTANCE
        )
    ]
    assert list(distance_candidates(structures.parts[0])) == expected
    assert {3, 17, 70, 90} <= set(expected) and 40 not in expected


def read_structures_of(frames):
    from atomtrain.data import FrameSet
    from atomtrain.data.columns import frames_from_values
    from atomtrain.data.extxyz import FrameReader

    reader = FrameReader(RESOURCES, TargetKeys(require_energy=False), Units(), checked=True)
    return FrameSet.whole(
        frames_from_values(
            "", [reader.values(i, atoms, False, False) for i, atoms in enumerate(frames)]
        )
    )


def test_elements_of_a_subset_are_found_chunk_by_chunk(monkeypatch):
    """A set's elements: its sources' elements bound them, and the chunk-by-chunk scan
    stops once it found them all; an element only in structures outside the set is not
    reported, one only in a late chunk is (the rarest element of a QM9 sample)."""
    from atomtrain.data import frames as frames_module

    monkeypatch.setattr(frames_module, "CHUNK", 7)
    structures = read_structures(RESOURCES / "qm9_reduced_100.xyz", TargetKeys(energy="U0"))
    numbers = [set(structures[i].atomic_numbers.tolist()) for i in range(len(structures))]
    assert structures.elements() == set().union(*numbers)
    rare = min(set().union(*numbers), key=lambda z: sum(z in found for found in numbers))
    having = [i for i, found in enumerate(numbers) if rare in found]
    without = [i for i, found in enumerate(numbers) if rare not in found]
    assert having and len(without) >= 20
    assert structures.subset(without).elements() == set().union(*(numbers[i] for i in without))
    late = without[:20] + having[-1:]  # the rare element only in the third chunk
    assert rare in structures.subset(late).elements()


def take_units(counter, limit: int, seconds_each: float) -> list[int]:
    import time

    taken = []
    for number in counter:
        if number >= limit:
            return taken
        time.sleep(seconds_each)
        taken.append(number)
    return taken


def test_a_slowed_worker_takes_fewer_units_and_each_unit_is_taken_once(tmp_path):
    """Conversion's workers take units from one counter: a worker four times slower (a
    core shared with another job) converts fewer, and no unit is done twice or left."""
    from atomtrain.data.workers import SharedCounter, run_in_processes

    counter = SharedCounter()
    jobs = [(counter, 40, 0.04), (counter, 40, 0.01)]
    slow, fast = run_in_processes(take_units, jobs, tmp_path / "output")
    assert sorted(slow + fast) == list(range(40))
    assert len(slow) < len(fast)
