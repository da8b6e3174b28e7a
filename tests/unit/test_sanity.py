"""The data survey before training: real data in wrong units, and a cutoff far too
large, are caught by values no atomistic data set has, with the unit or cutoff that
fixes them; the same data in its right units gives no finding."""

from __future__ import annotations

import ase.io
import numpy as np
import pytest

from atomtrain.data import TargetKeys, Units, read_structures
from atomtrain.errors import DataError
from atomtrain.training import sanity
from atomtrain.units import LENGTH_UNITS

from conftest import RESOURCES

ETHANOL = RESOURCES / "ethanol_reduced_100.xyz"  # kcal/mol, kcal/mol/A
ETHANOL_EV = RESOURCES / "ethanol_40.xyz"  # eV, eV/A
SILICON = RESOURCES / "si_test.xyz"  # eV, eV/A, with stress


def surveyed(path, length="angstrom", energy="eV", cutoff=5.0):
    structures = read_structures(path, TargetKeys(), Units(length=length, energy=energy))
    found = sanity.survey(structures, cutoff)
    return found, sanity.findings(found, length, energy)


@pytest.mark.parametrize(
    "path, energy", [(ETHANOL, "kcal/mol"), (ETHANOL_EV, "eV"), (SILICON, "eV")]
)
def test_data_in_its_units_gives_no_finding(path, energy):
    found, findings = surveyed(path, energy=energy)
    assert findings == []
    assert found.structures == found.searched == found.of
    assert 0.8 < float(np.median(found.nearest_ratio)) < 1.2
    report = sanity.report(found, "angstrom", energy)
    assert "neighbors per atom within 5 A" in report and "shortest interatomic distance" in report


def test_positions_in_nm_leave_every_atom_alone_and_stop_the_run():
    with pytest.raises(DataError, match="declare systems.length_unit: angstrom .it is nm."):
        surveyed(ETHANOL, length="nm", energy="kcal/mol")


def test_angstrom_declared_as_bohr_is_too_short_to_be_bonded():
    _, findings = surveyed(ETHANOL, length="bohr", energy="kcal/mol")
    names = [finding.name for finding in findings]
    assert "short_distances" in names
    text = findings[names.index("short_distances")].text
    assert "declare systems.length_unit: angstrom (it is bohr)" in text


def test_bohr_read_as_angstrom_is_too_long_to_be_bonded(tmp_path):
    scaled = tmp_path / "in_bohr.xyz"
    frames = ase.io.read(SILICON, ":")
    for atoms in frames:  # the same crystals with their lengths in bohr
        atoms.set_cell(atoms.cell / LENGTH_UNITS["bohr"], scale_atoms=True)
    ase.io.write(scaled, frames)
    _, findings = surveyed(scaled)
    texts = {finding.name: finding.text for finding in findings}
    assert "declare systems.length_unit: bohr (it is angstrom)" in texts["long_distances"]


@pytest.mark.parametrize("declared, expected", [("meV", "eV"), ("eV", "kcal/mol")])
def test_an_energy_unit_off_by_orders_of_magnitude_is_named(declared, expected):
    path = ETHANOL_EV if expected == "eV" else ETHANOL
    _, findings = surveyed(path, energy=declared)
    texts = {finding.name: finding.text for finding in findings}
    assert (
        f"declare the energy target's unit: {expected} (it is {declared})" in texts["force_scale"]
    )
    if declared == "meV":  # 1000x: the energies' spread too
        assert "unit: eV (it is meV)" in texts["energy_spread"]


def test_a_huge_cutoff_is_named_with_a_smaller_one_and_the_search_stops_early():
    found, findings = surveyed(SILICON, cutoff=30.0)
    assert found.searched < found.structures  # the pair budget was reached
    texts = {finding.name: finding.text for finding in findings}
    assert "within the cutoff of 30 A" in texts["many_neighbors"]
    assert "a cutoff near" in texts["many_neighbors"]


def test_a_sample_of_a_large_set_is_the_same_every_time():
    structures = read_structures(SILICON, TargetKeys(), Units())
    first = sanity.survey(structures, 5.0, budget=10)
    second = sanity.survey(structures, 5.0, budget=10)
    assert first.structures == 10
    assert (first.neighbor_counts == second.neighbor_counts).all()
