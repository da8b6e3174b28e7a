"""Exported model file: same predictions through atomtrain's ASE calculator, older
exports still read, usable for MD. (Engines through metatomic: tests/integration/
test_metatomic.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ase
import ase.build
import numpy as np
import pytest
import torch

from atomtrain.ase import Calculator
from atomtrain.errors import AtomtrainError
from atomtrain.models.export import HYPERS_FILE, export, load_exported

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


def assert_calculator_reproduces(model, path) -> None:
    """The exported file at ``path``, through atomtrain's ASE calculator, gives
    ``model``'s energy, forces and stress on a strained crystal."""
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


def test_calculator_reproduces_the_model(exported):
    assert_calculator_reproduces(*exported)


EXPORT_IN_ITS_OWN_PROCESS = """
import sys
sys.path.insert(0, {tests!r})
from atomtrain import runtime
if {one_command}:
    runtime.this_process_runs_one_command()
from atomtrain.models.export import export
from helpers import small_model
export(small_model([8, 14]), {path!r})
import metatensor.torch
print("metatensor_operations" in sys.modules, hasattr(metatensor.torch, "add"))
"""


@pytest.mark.parametrize("one_command", [True, False])
def test_the_export_ending_a_command_leaves_metatensors_operations_out(
    exported, tmp_path, one_command
):
    """metatensor-torch compiles its Python operations with TorchScript when imported
    (0.9 s of each train and export command here), and metatomic uses none of them: the
    export that ends a command's process leaves them out, and its model is the same. A
    longer-lived process (a notebook, metatrain after it) keeps them."""
    path = tmp_path / "model.pt"
    script = EXPORT_IN_ITS_OWN_PROCESS.format(
        tests=str(Path(__file__).parents[1]), one_command=one_command, path=str(path)
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    kept = str(not one_command)
    assert result.stdout.split() == [kept, kept]
    model, _ = exported
    assert_calculator_reproduces(model, path)


def test_the_calculator_runs_unspecialized_on_a_cpu_and_restores_the_strategy(
    exported, monkeypatch
):
    """On a CPU the model runs with no shape specializations (TorchScript's fusion
    strategy empty: seconds of MACE's and PET's first steps, docs/engines.md), and the
    process's own strategy is back after each call."""
    _, path = exported
    mine = [("STATIC", 1), ("DYNAMIC", 3)]
    previous = torch.jit.set_fusion_strategy(mine)
    try:
        seen = []
        calculator = Calculator(str(path))
        model = calculator.model

        def watching(**inputs):  # the model, noting the strategy it runs under
            current = torch.jit.set_fusion_strategy(mine)
            torch.jit.set_fusion_strategy(current)
            seen.append(current)
            return model(**inputs)

        monkeypatch.setattr(calculator, "model", watching)
        atoms = crystal()
        atoms.calc = calculator
        atoms.get_potential_energy()
        assert seen == [[("STATIC", 0), ("DYNAMIC", 0)]]
        assert torch.jit.set_fusion_strategy(mine) == mine
    finally:
        torch.jit.set_fusion_strategy(previous)


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


def test_a_model_exported_before_metatomic_is_still_read(resources):
    """tests/resources/old_export/model.pt: atomtrain's own TorchScript format, written
    by the last version before the metatomic export (small_model([1, 6, 8]))."""
    atoms = ase.build.molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=1)
    expected = run_model(small_model([1, 6, 8]), [structure_from_atoms(atoms)])
    atoms.calc = Calculator(str(resources / "old_export" / "model.pt"))
    assert atoms.get_potential_energy() == pytest.approx(float(expected["energy"][0]), abs=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), expected["forces"].detach().numpy(), atol=1e-10)
    extra = {HYPERS_FILE: ""}
    load_exported(resources / "old_export" / "model.pt", extra=extra)
    assert json.loads(extra[HYPERS_FILE])["atomic_types"] == [1, 6, 8]


def test_export_keeps_other_files_in_the_extensions_directory(tmp_path):
    """The collected extensions are merged into extensions/: a user's own files there
    stay, and the model file appears only once its extensions are in place."""
    (tmp_path / "extensions").mkdir()
    (tmp_path / "extensions" / "mine.txt").write_text("kept")
    export(small_model([8, 14]), tmp_path / "model.pt")
    assert (tmp_path / "extensions" / "mine.txt").read_text() == "kept"
    assert list((tmp_path / "extensions").rglob("libsphericart_torch.so"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["extensions", "model.pt"]


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
    with pytest.raises(AtomtrainError, match="not a model file"):
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
