"""Exported TorchScript file: same predictions through the ASE calculator, correct
forces in a fresh process that imports only torch and sphericart, usable for MD."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ase
import ase.build
import numpy as np
import pytest
import torch

from atomtrain.ase import Calculator
from atomtrain.errors import AtomtrainError
from atomtrain.models.export import export, load_exported

from helpers import run_model, small_model, structure_from_atoms


def crystal():
    atoms = ase.build.bulk("SiO", "rocksalt", a=4.6, cubic=True)
    atoms.rattle(0.05, seed=2)
    return atoms


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = small_model([8, 14])
    path = tmp_path_factory.mktemp("export") / "model.pt"
    export(model, path)
    return model, path


def test_calculator_reproduces_the_model(exported):
    model, path = exported
    atoms = crystal()
    expected = run_model(model, [structure_from_atoms(atoms)], stress=True)
    atoms.calc = Calculator(str(path), device="cpu")
    assert atoms.get_potential_energy() == pytest.approx(float(expected["energy"][0]), abs=1e-9)
    assert atoms.get_total_energy() == pytest.approx(atoms.get_potential_energy())
    assert atoms.calc.get_property("free_energy") == pytest.approx(atoms.get_potential_energy())
    np.testing.assert_allclose(atoms.get_forces(), expected["forces"].detach().numpy(), atol=1e-9)
    stress = expected["stress"][0].detach().numpy()
    voigt = stress.reshape(9)[[0, 4, 8, 5, 2, 1]]
    np.testing.assert_allclose(atoms.get_stress(), voigt, atol=1e-9)


def test_no_stress_for_molecules(exported):
    _, path = exported
    atoms = ase.Atoms("SiO", positions=[[0, 0, 0], [1.6, 0, 0]])
    atoms.calc = Calculator(str(path))
    assert np.isfinite(atoms.get_potential_energy())
    from ase.calculators.calculator import PropertyNotImplementedError

    with pytest.raises(PropertyNotImplementedError):
        atoms.get_stress()


def test_unknown_element_is_a_clear_error(exported):
    _, path = exported
    atoms = ase.Atoms("SiH", positions=[[0, 0, 0], [1.5, 0, 0]])
    atoms.calc = Calculator(str(path))
    with pytest.raises(AtomtrainError, match=r"not trained on atomic numbers \[1\]"):
        atoms.get_potential_energy()


def test_exported_file_gives_right_forces_in_a_fresh_process(exported):
    """Only torch and sphericart.torch are imported: forces must still be -dE/dx."""
    _, path = exported
    script = textwrap.dedent(
        f"""
        import json, sys
        import torch
        import sphericart.torch
        model = torch.jit.load({str(path)!r})
        assert "atomtrain" not in sys.modules
        positions = torch.tensor([[0.0, 0.0, 0.0], [1.7, 0.1, -0.2], [0.2, 1.5, 0.3]],
                                 dtype=torch.float64)
        n = positions.shape[0]
        first = torch.tensor([i for i in range(n) for j in range(n) if i != j])
        second = torch.tensor([j for i in range(n) for j in range(n) if i != j])
        def run(p):
            return model(positions=p, cell=torch.zeros(1, 3, 3, dtype=torch.float64),
                         atomic_numbers=torch.tensor([14, 8, 8]),
                         system_index=torch.zeros(n, dtype=torch.long),
                         pair_first=first, pair_second=second,
                         cell_shifts=torch.zeros(len(first), 3, dtype=torch.float64),
                         periodic=torch.tensor([False]))
        forces = run(positions)["forces"]
        step = 1e-5
        differences = []
        for atom in range(n):
            for direction in range(3):
                plus = positions.clone(); plus[atom, direction] += step
                minus = positions.clone(); minus[atom, direction] -= step
                derivative = (run(plus)["energy"] - run(minus)["energy"]) / (2 * step)
                differences.append(abs(float(forces[atom, direction] + derivative)))
        print(json.dumps({{"max_difference": max(differences),
                          "max_force": float(forces.abs().max())}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    numbers = json.loads(result.stdout.strip().splitlines()[-1])
    assert numbers["max_force"] > 1e-4
    assert numbers["max_difference"] < 1e-6


def test_short_molecular_dynamics(exported):
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    _, path = exported
    atoms = crystal()
    atoms.calc = Calculator(str(path))
    MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(0))
    start = atoms.get_total_energy()
    VelocityVerlet(atoms, timestep=0.5 * ase.units.fs).run(20)
    assert np.isfinite(atoms.get_total_energy())
    # a conservative model keeps the total energy nearly constant over a short run
    assert abs(atoms.get_total_energy() - start) < 1e-2 * len(atoms)


def test_loading_a_file_that_is_not_a_model(tmp_path):
    bogus = tmp_path / "model.pt"
    bogus.write_text("not a model")
    with pytest.raises(AtomtrainError, match="not an exported atomtrain model"):
        load_exported(bogus)
    with pytest.raises(AtomtrainError, match="model file not found"):
        load_exported(tmp_path / "missing.pt")


def test_exported_model_keeps_cutoff_and_units(exported):
    model, path = exported
    loaded = load_exported(path)
    assert loaded.cutoff == model.cutoff
    assert loaded.length_unit == "angstrom" and loaded.energy_unit == "eV"
    assert list(loaded.atomic_types) == [8, 14]
    assert torch.equal(loaded.baseline, model.baseline)
