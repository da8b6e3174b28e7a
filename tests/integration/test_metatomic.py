"""The exported model in the engines people use, through metatomic, checked in processes
that never import atomtrain: metatomic-ase's calculator, i-PI's metatomic driver over a
UNIX socket, and ASE molecular dynamics from examples/md."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ase
import ase.build
import ase.io
import numpy as np
import pytest

from atomtrain.cli.main import main
from atomtrain.training.checkpoint import best_model

from conftest import RESOURCES
from helpers import (
    ENGINE_SETTINGS,
    TINY_PET,
    run_directories,
    run_model,
    structure_from_atoms,
    write_options,
)
from test_mace import TINY_MACE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def train(directory: Path, data: Path, **changes) -> tuple[Path, Path]:
    """A short real training run; its exported model and its run directory."""
    options = write_options(directory, data, **changes)
    model = directory / "model.pt"
    arguments = ["train", str(options), "--outputs", str(directory / "outputs"), "-o", str(model)]
    assert main(arguments) == 0
    (run,) = run_directories(directory / "outputs")
    return model, run


@pytest.fixture(scope="module")
def ethanol(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ethanol"), RESOURCES / "ethanol_40.xyz")


@pytest.fixture(scope="module")
def silicon(tmp_path_factory):
    return train(tmp_path_factory.mktemp("silicon"), RESOURCES / "si_test.xyz")


@pytest.fixture(scope="module")
def mace(tmp_path_factory):
    """A tiny MACE (mace-torch), exported the same way."""
    return train(
        tmp_path_factory.mktemp("mace"),
        RESOURCES / "ethanol_40.xyz",
        architecture__name="mace",
        architecture__model=TINY_MACE,
    )


@pytest.fixture(scope="module")
def pet(tmp_path_factory):
    """A tiny PET (metatrain's PETBackend), exported the same way."""
    return train(
        tmp_path_factory.mktemp("pet"),
        RESOURCES / "ethanol_40.xyz",
        architecture__name="pet",
        architecture__model=TINY_PET,
    )


def ethanol_molecule() -> ase.Atoms:
    atoms = ase.io.read(RESOURCES / "ethanol_40.xyz", index=3)
    atoms.calc = None
    return atoms


def ethanol_in_a_box() -> ase.Atoms:
    """Periodic: the box is small enough that the molecule sees its own images."""
    atoms = ethanol_molecule()
    atoms.set_cell(np.diag([6.0, 6.5, 7.0]) + 0.4 * np.eye(3)[[1, 2, 0]])
    atoms.pbc = True
    atoms.wrap()
    return atoms


def silicon_cell() -> ase.Atoms:
    atoms = ase.build.bulk("Si", "diamond", a=5.43, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.08, seed=4)
    shear = np.eye(3) + 0.02 * np.array([[0, 1, 0], [0, 0, 0], [1, 0, 0]])
    atoms.set_cell(atoms.cell.array @ shear, scale_atoms=True)
    return atoms


# runs in a fresh interpreter: metatomic only; atomtrain, sphericart.torch, mace-torch and
# metatrain never imported
ENGINE_SIDE = ENGINE_SETTINGS + textwrap.dedent(
    """
    import json, sys
    import ase.io
    import numpy as np
    import torch
    from metatensor.torch import Labels
    from metatomic.torch import ModelOutput
    from metatomic_ase import MetatomicCalculator

    request = json.loads(sys.argv[1])
    calculator = MetatomicCalculator(request["model"], extensions_directory=request["extensions"])
    results = []
    for path in request["structures"]:
        atoms = ase.io.read(path)
        atoms.calc = calculator
        result = {
            "energy": atoms.get_potential_energy(),
            "forces": atoms.get_forces().tolist(),
            "energies": atoms.get_potential_energies().tolist(),
        }
        if atoms.pbc.all():
            result["stress"] = atoms.get_stress().tolist()
        # forces against central finite differences of the energy, on the first 3 atoms
        step = 1e-4
        differences = []
        for atom in range(3):
            for direction in range(3):
                shifted = []
                for sign in (1, -1):
                    moved = atoms.copy()
                    moved.positions[atom, direction] += sign * step
                    moved.calc = calculator
                    shifted.append(moved.get_potential_energy())
                derivative = (shifted[0] - shifted[1]) / (2 * step)
                differences.append(abs(result["forces"][atom][direction] + derivative))
        result["finite_difference_error"] = max(differences)
        # selected_atoms: per-atom energies of atoms 1 and 2 only
        selected = Labels(["system", "atom"], torch.tensor([[0, 1], [0, 2]], dtype=torch.int32))
        outputs = calculator.run_model(
            atoms, {"energy": ModelOutput(sample_kind="atom")}, selected_atoms=selected
        )
        block = outputs["energy"].block()
        result["selected_samples"] = block.samples.values.tolist()
        result["selected_energies"] = block.values.detach().reshape(-1).tolist()
        results.append(result)
    # several systems in one call (as batched engines send them): the same energies
    frames = [ase.io.read(path) for path in request["structures"]]
    batched = calculator.compute_energy(frames, compute_forces_and_stresses=True)
    for result, energy, forces in zip(results, batched["energy"], batched["forces"]):
        result["batched_energy"] = float(energy)
        result["batched_forces"] = np.asarray(forces).tolist()
    # per-atom energies of several systems in one call, all and a selection across them
    per_atom = {"energy": ModelOutput(sample_kind="atom")}
    block = calculator.run_model(frames, per_atom)["energy"].block()
    last = len(frames) - 1
    across = Labels(["system", "atom"], torch.tensor([[last, 2], [0, 1]], dtype=torch.int32))
    chosen = calculator.run_model(frames, per_atom, selected_atoms=across)["energy"].block()
    batched_atoms = {
        "samples": block.samples.values.tolist(),
        "energies": block.values.detach().reshape(-1).tolist(),
        "selected_samples": chosen.samples.values.tolist(),
        "selected_energies": chosen.values.detach().reshape(-1).tolist(),
    }
    roots = (
        "atomtrain", "sphericart", "mace", "e3nn", "cuequivariance", "cuequivariance_torch",
        "metatrain",
    )
    imported = sorted(name for name in sys.modules if name.split(".")[0] in roots)
    print(json.dumps({"results": results, "batched_atoms": batched_atoms, "imported": imported}))
    """
)


def engine_predictions(model: Path, structures: list[ase.Atoms], directory: Path) -> dict:
    paths = []
    for number, atoms in enumerate(structures):
        paths.append(str(directory / f"structure_{number}.extxyz"))
        ase.io.write(paths[-1], atoms)
    request = {
        "model": str(model),
        "extensions": str(model.parent / "extensions"),
        "structures": paths,
    }
    result = subprocess.run(
        [sys.executable, "-c", ENGINE_SIDE, json.dumps(request)],
        capture_output=True,
        text=True,
        cwd=directory,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["ethanol", "silicon", "mace", "pet"])
@pytest.mark.slow
def test_metatomic_calculator_gives_atomtrains_predictions(case, request, tmp_path):
    """In a process without atomtrain, MetatomicCalculator gives the energies, forces and
    stress of atomtrain's own (Python) model to 1e-10, per-atom energies add up to the
    total, forces are -dE/dx, and selected_atoms picks the per-atom energies."""
    model, run = request.getfixturevalue(case)
    molecules = case in ("ethanol", "mace", "pet")
    structures = [ethanol_molecule(), ethanol_in_a_box()] if molecules else [silicon_cell()]
    engine = engine_predictions(model, structures, tmp_path)
    assert engine["imported"] == []
    python_model = best_model(run / "best.ckpt")
    # the structures as the engine read them (extended XYZ rounds the positions)
    structures = [ase.io.read(path) for path in sorted(tmp_path.glob("structure_*.extxyz"))]
    for atoms, result in zip(structures, engine["results"]):
        periodic = bool(atoms.pbc.all())
        expected = run_model(python_model, [structure_from_atoms(atoms)], stress=periodic)
        energy = float(expected["energy"][0].detach())
        assert result["energy"] == pytest.approx(energy, abs=1e-10, rel=0)
        forces = expected["forces"].detach().numpy()
        assert np.abs(forces).max() > 1e-4  # a real check, not zeros against zeros
        np.testing.assert_allclose(result["forces"], forces, atol=1e-10, rtol=0)
        if periodic:
            stress = expected["stress"][0].detach().numpy().reshape(9)[[0, 4, 8, 5, 2, 1]]
            assert np.abs(stress).max() > 1e-6
            np.testing.assert_allclose(result["stress"], stress, atol=1e-10, rtol=0)
        assert sum(result["energies"]) == pytest.approx(result["energy"], abs=1e-9, rel=0)
        assert result["batched_energy"] == pytest.approx(result["energy"], abs=1e-10, rel=0)
        np.testing.assert_allclose(result["batched_forces"], result["forces"], atol=1e-10)
        assert result["finite_difference_error"] < 1e-6
        assert result["selected_samples"] == [[0, 1], [0, 2]]
        np.testing.assert_allclose(
            result["selected_energies"], result["energies"][1:3], atol=1e-12, rtol=0
        )
    batched = engine["batched_atoms"]
    assert batched["samples"] == [
        [system, atom] for system, atoms in enumerate(structures) for atom in range(len(atoms))
    ]
    singles = [result["energies"] for result in engine["results"]]
    np.testing.assert_allclose(batched["energies"], sum(singles, []), atol=1e-10, rtol=0)
    last = len(structures) - 1
    assert batched["selected_samples"] == [[last, 2], [0, 1]]
    np.testing.assert_allclose(
        batched["selected_energies"], [singles[last][2], singles[0][1]], atol=1e-10, rtol=0
    )


def test_the_model_describes_itself(ethanol):
    from metatomic.torch import load_atomistic_model, read_model_metadata

    model_path, run = ethanol
    metadata = read_model_metadata(str(model_path))
    assert "ethanol_40.xyz" in metadata.description
    assert "energy, forces" in metadata.description
    references = " ".join(metadata.references["architecture"])
    assert "Bartók" in references and "Behler" in references
    capabilities = load_atomistic_model(
        str(model_path), extensions_directory=str(model_path.parent / "extensions")
    ).capabilities()
    assert capabilities.atomic_types == [1, 6, 8]
    assert capabilities.interaction_range == 4.0  # the cutoff of write_options
    assert capabilities.length_unit == "angstrom"
    assert capabilities.dtype == "float64"
    assert capabilities.outputs["energy"].unit == "eV"
    assert "cpu" in capabilities.supported_devices


def read_ipi_properties(path: Path) -> tuple[list[int], list[float]]:
    rows = [line.split() for line in path.read_text().splitlines() if not line.startswith("#")]
    return [int(float(row[0])) for row in rows], [float(row[5]) for row in rows]


@pytest.mark.parametrize("case", ["ethanol", "mace", "pet"])
@pytest.mark.slow
def test_ase_nve_conserves_the_total_energy(case, request, tmp_path):
    """examples/md/ase_md.py: 1,000 steps of 0.5 fs of NVE on ethanol at 300 K (300 for
    MACE and PET, whose steps cost more), with every architecture's export (a MACE model
    needs no extension, and its export once left no extensions directory, which the
    example requires). The total energy stays within 1 meV/atom of its start (measured
    0.015 meV/atom with this float64 model, 0.66 with the quick start's float32 one)."""
    model, _ = request.getfixturevalue(case)
    steps = 1000 if case == "ethanol" else 300
    assert (model.parent / "extensions").is_dir()
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "md" / "ase_md.py"),
            str(model),
            "--structure",
            str(RESOURCES / "ethanol_40.xyz"),
            "--ensemble",
            "nve",
            "--steps",
            str(steps),
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = np.genfromtxt(tmp_path / "md_nve.csv", delimiter=",", names=True)
    assert len(table) == steps + 1
    total = table["total_eV"]
    change = 1000 * np.abs(total - total[0]).max() / 9
    assert change < 1.0, f"total energy changed by {change:.3f} meV/atom"
    assert table["temperature_K"].mean() > 50  # it moved
    assert (tmp_path / "md_nve.png").stat().st_size > 10_000


@pytest.mark.slow
def test_md_examples_refuse_missing_files_in_one_line(ethanol, tmp_path):
    """ase_md.py and ipi/run.sh: a missing model, or a model moved without its
    extensions, is one line naming the path and exit code 2."""
    model, _ = ethanol
    alone = tmp_path / "alone" / "model.pt"
    alone.parent.mkdir()
    alone.write_bytes(model.read_bytes())
    commands = [
        [sys.executable, str(EXAMPLES / "md" / "ase_md.py")],
        ["bash", str(EXAMPLES / "md" / "ipi" / "run.sh")],
    ]
    for command in commands:
        for path, fragment in [
            (tmp_path / "missing.pt", "model file not found"),
            (alone, "extensions directory is not beside it"),
        ]:
            result = subprocess.run([*command, str(path)], capture_output=True, text=True)
            assert result.returncode == 2, result.stderr[-2000:]
            (line,) = result.stderr.strip().splitlines()
            assert str(path.parent) in line and fragment in line
    # an output directory that is not there is said before the first step, not after
    # the last (when the results would be lost)
    missing = tmp_path / "no_such_directory"
    result = subprocess.run(
        [*commands[0], str(model), "--steps", "100000", "--output", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert f"{missing}: output directory not found" in line


@pytest.mark.slow
def test_md_examples_refuse_direct_forces_of_a_model_without_them(ethanol, tmp_path):
    """``--non-conservative`` with a model trained without direct forces: the MD
    examples say so and exit 2; i-PI, whose driver fails, is not left waiting for it."""
    model, _ = ethanol
    commands = [
        [sys.executable, str(EXAMPLES / "md" / "ase_md.py"), str(model), "--non-conservative"],
        ["bash", str(EXAMPLES / "md" / "ipi" / "run.sh"), str(model), "nve", "--non-conservative"],
    ]
    for command, said in zip(commands, ["non_conservative_force", "does not support non-conserv"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert said in result.stderr.strip().splitlines()[-1]


def test_the_torchsim_example_without_torchsim_is_one_line():
    """Where TorchSim is not installed (it needs Python 3.12 from version 0.5), its
    example says what to install in one line, exit code 2, not a traceback."""
    if importlib.util.find_spec("torch_sim") and importlib.util.find_spec("metatomic_torchsim"):
        pytest.skip("TorchSim and metatomic-torchsim are installed here")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "md" / "torchsim_md.py"), "model.pt"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert "is not installed" in line and "pip install torch-sim-atomistic" in line


@pytest.mark.parametrize("case", ["ethanol", "mace", "pet"])
@pytest.mark.slow
def test_the_ipi_example_drives_every_architecture_through_its_metatomic_driver(
    case, request, tmp_path
):
    """examples/md/ipi/run.sh as a user runs it, shortened to 12 steps: i-PI runs NVE
    with the model (SOAP-BPNN, MACE, PET) served by i-PI's metatomic driver over a UNIX
    socket, and the plot is drawn; the driver process loads metatomic only, and i-PI's
    potential energies and forces equal atomtrain's own model's at the same positions."""
    model, run = request.getfixturevalue(case)
    example = tmp_path / "ipi"
    shutil.copytree(EXAMPLES / "md" / "ipi", example)
    nve = example / "input-nve.xml"
    nve.write_text(nve.read_text().replace("<total_steps>1000<", "<total_steps>12<"))
    result = subprocess.run(
        ["bash", str(example / "run.sh"), str(model), "nve"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stderr + (example / "ipi.log").read_text())[-3000:]
    assert "atomtrain" not in result.stderr  # the driver process loaded metatomic only
    steps, potentials = read_ipi_properties(example / "md.out")
    assert steps[-1] == 12 and np.ptp(potentials) > 1e-5  # the atoms moved
    assert (example / "md_ipi_nve.png").stat().st_size > 10_000
    frames = ase.io.read(example / "md.pos_0.extxyz", index=":")
    assert len(frames) == len(potentials)
    forces = [frame.get_forces() for frame in ase.io.read(example / "md.for_0.extxyz", ":")]
    # atomtrain's own model, which the engines give to 1e-10
    # (test_metatomic_calculator_gives_atomtrains_predictions)
    python_model = best_model(run / "best.ckpt")
    for potential, force, frame in zip(potentials, forces, frames):
        expected = run_model(python_model, [structure_from_atoms(frame)])
        # to the digits i-PI prints: 9 significant for energies, 8 decimals for forces
        assert potential == pytest.approx(float(expected["energy"][0]), abs=6e-6, rel=0)
        np.testing.assert_allclose(force, expected["forces"].detach().numpy(), atol=1e-7, rtol=0)


def test_atomtrain_imported_after_an_engine_loaded_the_model(ethanol, tmp_path):
    """metatomic loads the collected copy of sphericart's library; importing atomtrain
    (which imports sphericart.torch) afterwards must not load it a second time, which
    aborts the process. Both calculators then agree, and sphericart's autograd works."""
    model, _ = ethanol
    script = textwrap.dedent(
        f"""
        import ase.io, numpy, torch
        from metatomic_ase import MetatomicCalculator
        atoms = ase.io.read({str(RESOURCES / "ethanol_40.xyz")!r}, 0)
        atoms.calc = MetatomicCalculator({str(model)!r},
                                         extensions_directory={str(model.parent / "extensions")!r})
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        from atomtrain.ase import Calculator
        atoms.calc = Calculator({str(model)!r})
        assert abs(atoms.get_potential_energy() - energy) < 1e-10
        assert numpy.abs(atoms.get_forces() - forces).max() < 1e-10
        import sphericart.torch
        x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
        sphericart.torch.SphericalHarmonics(2)(x).sum().backward()
        assert x.grad.abs().sum() > 0
        print("agree")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("agree")


@pytest.mark.slow
def test_export_with_sphericart_imported_from_outside_site_packages(ethanol, tmp_path):
    """A user whose packages are on PYTHONPATH (pip install --target, a cluster's module
    system) exports too: metatomic collects an extension at its path relative to
    site-packages, and one from elsewhere was copied onto itself and refused."""
    _, run = ethanol
    installed = Path(
        subprocess.check_output(
            [
                sys.executable,
                "-c",
                "import sphericart, os; print(os.path.dirname(sphericart.__path__[0]))",
            ],
            text=True,
        ).strip()
    )
    elsewhere = tmp_path / "elsewhere"
    for name in ("sphericart", "sphericart_torch.libs"):
        if (installed / name).exists():
            shutil.copytree(installed / name, elsewhere / name)
    environment = {
        **os.environ,
        "PYTHONPATH": f"{elsewhere}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    origin = subprocess.check_output(
        [sys.executable, "-c", "import sphericart.torch; print(sphericart.torch.__file__)"],
        text=True,
        env=environment,
    )
    assert Path(origin.strip()).is_relative_to(elsewhere)
    exported = tmp_path / "exported" / "model.pt"
    exported.parent.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "atomtrain", "export", str(run / "best.ckpt"), "-o", str(exported)],
        capture_output=True,
        text=True,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    collected = [
        path.relative_to(exported.parent / "extensions")
        for path in (exported.parent / "extensions").rglob("*.so")
    ]
    assert collected and all(str(path).startswith("sphericart") for path in collected)
    shutil.rmtree(elsewhere)  # the engine loads the collected copy, not the import root
    engine = engine_predictions(exported, [ethanol_molecule()], tmp_path)
    # the structure as the engine read it; atomtrain's own model, which the engines give
    # to 1e-10 (test_metatomic_calculator_gives_atomtrains_predictions)
    atoms = ase.io.read(tmp_path / "structure_0.extxyz")
    expected = run_model(best_model(run / "best.ckpt"), [structure_from_atoms(atoms)])
    assert engine["results"][0]["energy"] == pytest.approx(
        float(expected["energy"][0]), abs=1e-10, rel=0
    )
    np.testing.assert_allclose(
        engine["results"][0]["forces"], expected["forces"].detach().numpy(), atol=1e-10, rtol=0
    )


def test_export_collects_only_the_extensions_the_architecture_calls(mace, ethanol, tmp_path):
    """metatomic lists every torch extension loaded in the process; a MACE model
    exported where sphericart (or torchvision, imported by a dependency) is loaded must
    not ask engines for it, and SOAP-BPNN's still carries sphericart."""
    import torch

    from atomtrain.models.export import export
    from atomtrain.models.soap_bpnn.harmonics_library import import_sphericart_torch

    import_sphericart_torch()
    assert any("sphericart" in library for library in torch.ops.loaded_libraries)
    for (_, run), name, expected in [(mace, "mace", []), (ethanol, "soap", ["sphericart"])]:
        exported = tmp_path / name / "model.pt"
        exported.parent.mkdir()
        export(best_model(run / "best.ckpt"), exported)
        collected = sorted(
            path.relative_to(exported.parent / "extensions").parts[0]
            for path in (exported.parent / "extensions").rglob("*.so")
        )
        assert sorted(set(collected)) == expected
    assert any("sphericart" in library for library in torch.ops.loaded_libraries)  # restored
