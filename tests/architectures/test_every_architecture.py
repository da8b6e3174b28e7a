"""One suite over every registered architecture (registry.known()): what any model
atomtrain trains must do, whatever its package. A new architecture is a package and a
registry line; it runs here with its section's defaults, or with a small section from
SMALL_SECTIONS when its defaults are slow.

- energies invariant, forces and stress equivariant under rotation, to float64
  precision, for a molecule and a strained periodic crystal (architectures that are not
  invariant by construction, PET, learn it from rotated structures: see
  tests/integration/test_augmentation.py);
- energies invariant under translation and a permutation of the atoms;
- forces and stress equal finite differences of the energy;
- a float32 model gives the float64 model's energies to float32 precision;
- the energy is linear in the last-layer features LLPR takes (training/llpr.py);
- the compiled training step (training/compiled.py) gives the eager step's energies,
  forces, stress and parameter gradients to 1e-10 (SOAP-BPNN for two batch sizes from
  one compilation), or is
  refused (PET) and the step is eager (MACE and PET, slow: without inductor's code
  generation);
- a trained run's checkpoint gives the model its export gives, and that export runs
  in a process that never imports atomtrain (slow);
- fine-tuning starts from the trained model (slow); its heads and lora methods train
  the heads or the adapters only, every other parameter bitwise as it was (heads on two
  processes), and lora's export (adapters merged) is the adapted model (slow);
- ``--nproc 2`` trains the one-process model, on a training list of a file of
  molecules and a converted directory of cells with stress, packed by atoms (slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from fnmatch import fnmatch

import ase
import ase.build
import ase.io
import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from atomtrain.cli.main import main
from atomtrain.data import collate
from atomtrain.models import registry
from atomtrain.models.export import load_exported
from atomtrain.targets import Irrep, TargetSpec
from atomtrain.training.checkpoint import best_model, load_checkpoint
from atomtrain.training.compiled import (
    CompilationFailed,
    CompiledPredictions,
    DynamicStep,
    SizeHeldConstant,
)
from atomtrain.training.evaluation import predict
from atomtrain.training.llpr import atomic_last_layer, edge_inputs

from conftest import RESOURCES
from helpers import (
    ENGINE_SETTINGS,
    SMALL_MODEL,
    TINY_MACE,
    TINY_PET,
    run_directories,
    run_model,
    structure_from_atoms,
    write_options,
)

ETHANOL = RESOURCES / "ethanol_40.xyz"
SILICON = RESOURCES / "si_test.xyz"  # cells of 63 atoms, with stress
SMALL_SECTIONS = {
    "soap_bpnn": SMALL_MODEL,
    "mace": TINY_MACE,
    "pet": TINY_PET,
}
ARCHITECTURES = registry.known()


def new_model(name: str, atomic_types: list[int], dtype=torch.float64, seed: int = 0, **changes):
    """A small untrained model with a non-trivial baseline and scale; ``changes`` to
    its model section."""
    torch.manual_seed(seed)
    model = registry.new_model(name, atomic_types, 9.0, **{**SMALL_SECTIONS[name], **changes})
    model = model.set_precision(dtype)
    model.set_baseline(torch.linspace(-3.0, -1.0, len(atomic_types)), 0.7)
    return model


def frames_as_structures(frames):
    return [structure_from_atoms(atoms) for atoms in frames]


def molecule() -> ase.Atoms:
    return ase.io.read(ETHANOL, index=2)


def crystal() -> ase.Atoms:
    """Rattled, sheared rutile-like TiO2: two elements, a cell that is not orthogonal."""
    atoms = ase.Atoms(
        "Ti2O4",
        scaled_positions=[
            [0, 0, 0],
            [0.5, 0.5, 0.5],
            [0.3, 0.3, 0],
            [0.7, 0.7, 0],
            [0.8, 0.2, 0.5],
            [0.2, 0.8, 0.5],
        ],
        cell=[4.6, 4.6, 2.96],
        pbc=True,
    )
    atoms.rattle(0.05, seed=1)
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.03 * np.triu(np.ones((3, 3)), 1)), True)
    return atoms


def predictions(model, atoms: ase.Atoms) -> dict[str, np.ndarray]:
    periodic = bool(atoms.pbc.all())
    found = run_model(model, [structure_from_atoms(atoms)], stress=periodic)
    return {key: value.detach().double().numpy() for key, value in found.items()}


@pytest.mark.parametrize("make", [molecule, crystal])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_energies_invariant_forces_and_stress_equivariant_under_rotation(name, make):
    if registry.architecture(name).augments_rotations:
        pytest.skip("not invariant by construction: trained on rotated structures instead")
    atoms = make()
    model = new_model(name, sorted(set(atoms.numbers)))
    rotation = Rotation.random(random_state=3).as_matrix()
    rotated = atoms.copy()
    rotated.positions = atoms.positions @ rotation.T
    rotated.cell = atoms.cell.array @ rotation.T
    before, after = predictions(model, atoms), predictions(model, rotated)
    assert after["energy"][0] == pytest.approx(before["energy"][0], abs=1e-10, rel=0)
    assert np.abs(before["forces"]).max() > 1e-3  # something to rotate
    np.testing.assert_allclose(after["forces"], before["forces"] @ rotation.T, atol=1e-10)
    if "stress" in before:
        expected = rotation @ before["stress"][0] @ rotation.T
        np.testing.assert_allclose(after["stress"][0], expected, atol=1e-10)


@pytest.mark.parametrize("make", [molecule, crystal])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_energies_invariant_under_translation_and_permutation_of_atoms(name, make):
    atoms = make()
    model = new_model(name, sorted(set(atoms.numbers)))
    moved = atoms.copy()
    moved.positions += [0.7, -1.3, 2.1]
    order = np.random.default_rng(0).permutation(len(atoms))
    permuted = atoms[order]
    before = predictions(model, atoms)
    for changed, forces in [(moved, before["forces"]), (permuted, before["forces"][order])]:
        after = predictions(model, changed)
        assert after["energy"][0] == pytest.approx(before["energy"][0], abs=1e-10, rel=0)
        np.testing.assert_allclose(after["forces"], forces, atol=1e-10)


@pytest.mark.parametrize("make", [molecule, crystal])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_forces_and_stress_equal_finite_differences(name, make):
    atoms = make()
    model = new_model(name, sorted(set(atoms.numbers)))

    def energy(moved: ase.Atoms) -> float:
        found = run_model(model, [structure_from_atoms(moved)], forces=False)
        return float(found["energy"][0].detach())

    predicted = predictions(model, atoms)
    step = 1e-5
    for atom, direction in [(0, 0), (1, 2), (len(atoms) - 1, 1)]:
        shifted = []
        for sign in (1, -1):
            moved = atoms.copy()
            moved.positions[atom, direction] += sign * step
            shifted.append(energy(moved))
        derivative = (shifted[0] - shifted[1]) / (2 * step)
        assert predicted["forces"][atom, direction] == pytest.approx(-derivative, abs=1e-7)
    if "stress" in predicted:
        volume = atoms.get_volume()
        assert np.abs(predicted["stress"]).max() > 1e-4
        for i, j in [(0, 0), (1, 2), (2, 1)]:
            shifted = []
            for sign in (1, -1):
                # a symmetric strain: for a model that is not invariant by construction,
                # a rotation is not free, and the stress is the symmetric derivative
                strain = np.eye(3)
                strain[i, j] += sign * step / 2
                strain[j, i] += sign * step / 2
                moved = atoms.copy()
                moved.set_cell(atoms.cell.array @ strain.T, scale_atoms=True)
                shifted.append(energy(moved))
            derivative = (shifted[0] - shifted[1]) / (2 * step) / volume
            assert predicted["stress"][0, i, j] == pytest.approx(derivative, abs=1e-7)


# the compiled step's check traces one interaction (MACE) and one GNN layer (PET): the
# same operators as two, in half the time (54 and 35 s beside another job with two)
ONE_LAYER = {"mace": {"num_interactions": 1}, "pet": {"num_gnn_layers": 1}}


def molecule_and_crystal(name: str) -> tuple[list[ase.Atoms], torch.nn.Module]:
    """A molecule and a strained crystal, and a one-layer model of their elements: what
    the compiled step is checked on."""
    atoms = [molecule(), crystal()]
    types = sorted({int(z) for each in atoms for z in each.numbers})
    return atoms, new_model(name, types, **ONE_LAYER.get(name, {}))


def without_code_generation(graph, example_inputs):
    """AOT autograd on the traced graph, without inductor's C++: inductor takes a
    minute (SOAP-BPNN, cold cache, beside another job) to minutes (MACE, PET) on two
    cores. What went wrong for MACE and PET went wrong before code generation
    (docs/performance-notes.md); inductor's is tested by whole runs
    (tests/integration/test_compiled.py)."""
    from torch._dynamo.backends.debugging import aot_eager

    return aot_eager(graph, example_inputs)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[] if name == "soap_bpnn" else [pytest.mark.slow])
        for name in ARCHITECTURES
    ],
)
def test_the_compiled_step_gives_the_eager_predictions_and_gradients(name):
    """float64: two batches of molecules and strained crystals (stress). A graph that
    would disagree is refused, and the step is eager."""
    atoms, model = molecule_and_crystal(name)
    compiled = CompiledPredictions(
        model, True, True, required=False, compiler=without_code_generation
    )
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    keys = ("energy", "forces", "stress")
    # SOAP-BPNN's one graph takes a batch of other sizes; MACE's graphs are per batch
    # shape, and another shape would cost another trace (half a minute)
    other = [atoms[1], atoms[0], atoms[1]] if name == "soap_bpnn" else atoms[::-1]
    for structures in (atoms, other):
        batch = collate([structure_from_atoms(each) for each in structures], model.cutoff)
        batch = batch.to("cpu", torch.float64)
        found = {}
        for label, predictions in (
            ("eager", predict(model, batch, True, True, True)),
            ("compiled", compiled(batch)),
        ):
            loss = sum(
                (0.3 + index) * (predictions[key] ** 2).sum() for index, key in enumerate(keys)
            )
            gradients = torch.autograd.grad(loss, parameters)
            found[label] = [predictions[key].detach() for key in keys] + list(gradients)
        for eager, traced in zip(found["eager"], found["compiled"]):
            scale = float(eager.abs().max())
            assert float((traced - eager).abs().max()) <= 1e-10 * scale
    assert compiled.failed is None and compiled.eager_batches == 0
    assert compiled.compilations >= 1
    # one graph for every batch, unless the architecture says its graph holds a size
    per_shape = registry.architecture(name).graph_holds_batch_sizes
    assert (compiled.shaped is not None, compiled.dynamic is not None) == (per_shape, not per_shape)


HOLDING_SIZES = [
    name for name in ARCHITECTURES if registry.architecture(name).graph_holds_batch_sizes
]


@pytest.mark.slow
@pytest.mark.parametrize("name", HOLDING_SIZES)
def test_an_architecture_said_to_hold_batch_sizes_does(name):
    """The flag spares each compiled run of the architecture the two symbolic traces
    that show it (20 s of MACE's start); a graph that took every size (another version
    of its library) would be compiled per shape for nothing. Traced twice, on batches of
    other sizes, its graphs differ."""
    atoms, model = molecule_and_crystal(name)
    batch = collate([structure_from_atoms(each) for each in atoms], model.cutoff)
    with pytest.raises(SizeHeldConstant):
        DynamicStep(model, batch.to("cpu", torch.float64), True, True, without_code_generation)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_graph_with_the_right_values_and_wrong_derivatives_is_refused(name):
    """The check of a new graph: predictions equal to the eager step's, but whose
    derivatives in the parameters are 1e-3 off (as PET's were, before layer norm's
    forward was decomposed), are refused, naming a gradient."""
    model = new_model(name, [1, 6, 8], **ONE_LAYER.get(name, {}))
    batch = collate([structure_from_atoms(molecule())], model.cutoff).to("cpu", torch.float64)
    compiled = CompiledPredictions(model, True, False, required=True)
    eager = predict(model, batch, True, False, True)
    wrong = {key: value.detach() + 1.001 * (value - value.detach()) for key, value in eager.items()}
    with pytest.raises(CompilationFailed, match="the gradient of .* relative"):
        compiled.verify(batch, wrong)
    compiled.verify(batch, predict(model, batch, True, False, True))  # the same: accepted


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_energy_is_linear_in_its_last_layer_features(name):
    """LLPR's features are the inputs of the energy's last linear layers: each atom's
    unscaled energy is a linear function of them, plus a constant per element, found by
    least squares to float64 precision on more atoms than features."""
    torch.manual_seed(3)
    model = new_model(name, [1, 6, 8])
    frames = ase.io.read(ETHANOL, index=":40")
    batch = collate(frames_as_structures(frames), model.cutoff)
    with torch.no_grad():
        energies, features = model.energies_and_last_layer_features(*edge_inputs(model, batch))
    # what LLPR takes as the energy's features
    assert torch.equal(atomic_last_layer(model, batch)["energy"][:, 0], features)
    expected = run_model(model, frames_as_structures(frames), forces=False)["energy"]
    totals = torch.zeros_like(expected).index_add(0, batch.system_index, energies)
    torch.testing.assert_close(totals, expected, rtol=1e-14, atol=0)
    element = model.type_to_index[batch.atomic_numbers]
    raw = (energies - model.baseline[element]) / model.scale
    design = torch.cat([features, torch.nn.functional.one_hot(element).double()], dim=1)
    assert design.shape[0] > 2 * design.shape[1]
    solution = torch.linalg.lstsq(design, raw.unsqueeze(1), driver="gelsd").solution
    residual = (design @ solution).squeeze(1) - raw
    assert float(residual.abs().max()) <= 1e-9 * float(raw.abs().max())
    # and not trivially so: these columns do not fit any numbers
    noise = torch.randn_like(raw)
    solution = torch.linalg.lstsq(design, noise.unsqueeze(1), driver="gelsd").solution
    assert float(((design @ solution).squeeze(1) - noise).abs().max()) > 0.1


# one target of each kind whose head is linear in its last layer, and two that are not
LLPR_SPECS = [
    TargetSpec("mtt::gap", "g", "scalar", num_subtargets=2),
    TargetSpec("mtt::dipole", "d", "cartesian", rank=1),
    TargetSpec(
        "mtt::proper",
        "p",
        "spherical",
        irreps=(Irrep(0, 1), Irrep(1, 1), Irrep(2, 1)),
        num_subtargets=2,
        per_atom=True,
    ),
    TargetSpec("mtt::polarizability", "a", "cartesian", rank=2, num_subtargets=2),
    TargetSpec("mtt::pseudo", "q", "spherical", irreps=(Irrep(1, -1), Irrep(2, -1))),
]
LINEAR = ["energy/other", "mtt::gap", "mtt::dipole", "mtt::proper"]


def model_with_llpr_heads(name):
    """A small model with an energy variant (learning its difference to the first
    energy) and LLPR_SPECS' heads, all non-trivial."""
    model = new_model(name, [1, 6, 8])
    model.attach_targets(LLPR_SPECS, ["energy", "energy/other"], relative=[True])
    generator = torch.Generator().manual_seed(4)
    for head in [*model.heads, *model.variant_heads]:
        for parameter in (head.network[-1].weight, head.network[-1].bias, head.baseline):
            parameter.data.copy_(torch.randn(parameter.shape, generator=generator))
        head.scale.fill_(1.3)
    return model


def constant_rows(name: str) -> list[bool]:
    """Which of an output's components have a constant part (bias and per-element
    baseline): its o3_lambda 0 ones."""
    if name.startswith("energy"):
        return [True]
    (spec,) = [spec for spec in LLPR_SPECS if spec.name == name]
    return [irrep.o3_lambda == 0 for irrep in spec.blocks() for _ in range(2 * irrep.o3_lambda + 1)]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_energy_and_target_is_linear_in_its_last_layer_features(name):
    """LLPR's features of an energy variant (one learning its difference to the first
    energy) and of each mtt:: target with proper blocks only are the inputs of their
    heads' last linear maps: each atom's every component of every subtarget is a linear
    function of them, plus a constant per element for o3_lambda 0 components, to float64
    precision."""
    model = model_with_llpr_heads(name)
    assert model.llpr_outputs == ["energy", "energy/other"] + [s.name for s in LLPR_SPECS]
    frames = ase.io.read(ETHANOL, index=":40")
    batch = collate(frames_as_structures(frames), model.cutoff)
    features = atomic_last_layer(model, batch)
    with torch.no_grad():
        atomic = model.atomic_predictions(*edge_inputs(model, batch))
    element = torch.nn.functional.one_hot(model.type_to_index[batch.atomic_numbers]).double()
    for output in LINEAR:
        subtargets = model.llpr_subtargets[model.llpr_outputs.index(output)]
        atoms = features[output].shape[0]
        rows = features[output].reshape(atoms, -1, subtargets, features[output].shape[2])
        values = atomic[output].double().reshape(atoms, -1, subtargets)
        components = values.shape[1]
        constant = torch.tensor(constant_rows(output), dtype=torch.float64)
        offsets = element.unsqueeze(1) * constant.reshape(1, -1, 1)
        for subtarget in range(subtargets):
            design = torch.cat([rows[:, :, subtarget], offsets], dim=2)
            design = design.reshape(atoms * components, -1)
            assert design.shape[0] > 2 * design.shape[1], output
            target = values[:, :, subtarget].reshape(-1, 1)
            solution = torch.linalg.lstsq(design, target, driver="gelsd").solution
            residual = (design @ solution - target).abs().max()
            assert float(residual) <= 1e-9 * float(target.abs().max()), (output, subtarget)
        noise = torch.randn(design.shape[0], 1, dtype=torch.float64)
        solution = torch.linalg.lstsq(design, noise, driver="gelsd").solution
        assert float((design @ solution - noise).abs().max()) > 0.1, output


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_targets_last_layer_features_are_its_derivatives_in_that_layer(name):
    """Each mtt:: target's LLPR features, its pseudo-tensor blocks (not linear: the
    polarisability's antisymmetric part, spherical o3_sigma -1) included, are the
    derivatives of its values in its head's last linear map (the weights, and the
    biases of its non-invariant coefficients), up to the head's scale: the two have the
    same Gram matrix within each subtarget (which the columns' order does not change),
    checked by autograd on two molecules."""
    model = model_with_llpr_heads(name)
    frames = ase.io.read(ETHANOL, index=":2")
    batch = collate(frames_as_structures(frames), model.cutoff)
    features = atomic_last_layer(model, batch)
    atomic = model.atomic_predictions(*edge_inputs(model, batch))
    for index, spec in enumerate(LLPR_SPECS):
        head = model.heads[index]
        last = head.network[-1]
        invariant = torch.cat(
            [
                torch.full((size,), o3_lambda == 0)
                for size, (o3_lambda, _) in zip(head.sizes, head.blocks)
            ]
        )
        values = atomic[spec.name].reshape(-1)
        derivatives = []
        for value in values:
            weight, bias = torch.autograd.grad(value, [last.weight, last.bias], retain_graph=True)
            derivatives.append(torch.cat([weight.reshape(-1), bias[~invariant]]))
        jacobian = torch.stack(derivatives).double()
        ours = features[spec.name].reshape(values.shape[0], -1) * float(head.scale)
        # subtargets share the columns (their weights are alike), not the weights
        subtarget = torch.arange(values.shape[0]) % spec.num_subtargets
        same = (subtarget.unsqueeze(0) == subtarget.unsqueeze(1)).double()
        expected = jacobian @ jacobian.T
        assert float((expected * (1 - same)).abs().max()) == 0
        assert float(expected.abs().max()) > 0
        tolerance = 1e-9 * float(expected.abs().max())
        torch.testing.assert_close((ours @ ours.T) * same, expected, rtol=1e-9, atol=tolerance)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_float32_model_gives_the_float64_energies_to_float32_precision(name):
    atoms = crystal()
    types = sorted(set(atoms.numbers))
    high, low = new_model(name, types), new_model(name, types, torch.float32)
    structure = structure_from_atoms(atoms)
    energy64 = run_model(high, [structure])["energy"]
    energy32 = run_model(low, [structure], dtype=torch.float32)["energy"]
    assert energy32.dtype == torch.float64  # total energies are summed in float64
    assert torch.allclose(energy32, energy64, rtol=1e-5)


def options_for(directory, name, **changes):
    directory.mkdir(parents=True, exist_ok=True)
    return write_options(
        directory,
        ETHANOL,
        architecture__name=name,
        architecture__model=SMALL_SECTIONS.get(name, {}),
        architecture__training__batch_size=4,
        architecture__training__num_epochs=2,
        **changes,
    )


def train(directory, options, *extra) -> object:
    outputs = directory / "outputs"
    assert main(["train", str(options), "--outputs", str(outputs), *map(str, extra)]) == 0
    (run,) = run_directories(outputs)
    return run


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A trained run per architecture, made once for the tests that start from one."""
    runs = {}

    def run_of(name):
        if name not in runs:
            directory = tmp_path_factory.mktemp(f"trained_{name}")
            runs[name] = train(directory, options_for(directory, name))
        return runs[name]

    return run_of


ENGINE = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic_ase import MetatomicCalculator
atoms = ase.io.read(sys.argv[2], 2)
atoms.calc = MetatomicCalculator(sys.argv[1], extensions_directory=sys.argv[3])
energy = atoms.get_potential_energy()
print(json.dumps({"energy": energy, "atomtrain": "atomtrain" in sys.modules}))
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_checkpoint_export_and_fine_tuning_of_a_trained_run(name, tmp_path, trained_runs):
    """The best checkpoint gives the exported model's energy in an engine's process
    that never imports atomtrain; a fine-tuning run starts from that model."""
    run = trained_runs(name)
    model = best_model(run / "best.ckpt")
    assert load_checkpoint(run / "best.ckpt").architecture == name
    ours = float(predictions(model, molecule())["energy"][0])
    engine = subprocess.run(
        [
            sys.executable,
            "-c",
            ENGINE,
            str(run / "model.pt"),
            str(ETHANOL),
            str(run / "extensions"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert engine.returncode == 0, engine.stderr[-2000:]
    found = json.loads(engine.stdout.strip().splitlines()[-1])
    assert not found["atomtrain"]
    assert found["energy"] == pytest.approx(ours, abs=1e-6)
    finetune = {"read_from": str(run / "best.ckpt")}
    options = options_for(tmp_path / "second", name, architecture__training__finetune=finetune)
    tuned = train(tmp_path / "second", options)
    assert f"fine-tuning the best model of {run / 'best.ckpt'}" in (tuned / "train.log").read_text()


@pytest.fixture(scope="module")
def silicon_directory(tmp_path_factory):
    """Six silicon cells of 63 atoms with stress, converted to a directory."""
    directory = tmp_path_factory.mktemp("silicon")
    ase.io.write(directory / "cells.xyz", ase.io.read(SILICON, ":6"))
    assert main(["convert", str(directory / "cells.xyz"), "-o", str(directory / "cells")]) == 0
    return directory / "cells"


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_two_processes_train_the_one_process_model(name, tmp_path, silicon_directory):
    """A training list of ethanol molecules (extended XYZ) and silicon cells with stress
    (a converted directory), batches packed by atom count: ``--nproc 2`` gives the
    one-process model, and the final table has a row per file."""
    weights = []
    for processes in (1, 2):
        directory = tmp_path / f"nproc{processes}"
        options = options_for(
            directory,
            name,
            training_set=[
                {"systems": {"read_from": str(ETHANOL)}},
                {"systems": {"read_from": str(silicon_directory)}},
            ],
            architecture__training__max_atoms_per_batch=140,
            test_set=0.0,
        )
        run = train(directory, options, "--nproc", processes)
        log = (run / "train.log").read_text()
        assert "train: cells" in log and "training batches packed by atom count" in log
        assert "S RMSE" in log  # the silicon cells' stress is trained
        weights.append(torch.load(run / "last.ckpt", weights_only=True)["model_state"])
    # PET pads each atom's neighbors to the batch's widest neighborhood, and the sums
    # over that padded axis round differently for another width (a share of the batch):
    # 1e-16 per step, 1e-9 relative after two epochs
    tolerance = 1e-7 if name == "pet" else 1e-10
    for key, value in weights[0].items():
        torch.testing.assert_close(weights[1][key], value, rtol=tolerance, atol=tolerance / 100)


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_heads_fine_tuning_keeps_every_other_parameter_bitwise_on_two_processes(
    name, tmp_path, trained_runs
):
    run = trained_runs(name)
    pretrained = best_model(run / "best.ckpt").state_dict()
    finetune = {"read_from": str(run / "best.ckpt"), "method": "heads"}
    options = options_for(tmp_path / "second", name, architecture__training__finetune=finetune)
    tuned_run = train(tmp_path / "second", options, "--nproc", 2)
    tuned = torch.load(tuned_run / "last.ckpt", weights_only=True)["model_state"]
    model = best_model(tuned_run / "best.ckpt")
    patterns = registry.architecture(name).head_modules(model_section(model))
    prefix = registry.architecture(name).module_prefix
    changed, kept = [], []
    for key, value in pretrained.items():
        if not value.is_floating_point() or key not in dict(model.named_parameters()):
            continue
        in_head = any(
            fnmatch(key, f"{prefix}{pattern}*") or fnmatch(key, f"{pattern}*")
            for pattern in patterns
        )
        (changed if in_head else kept).append(key)
        if not in_head:
            assert torch.equal(tuned[key], value), key
    assert kept and changed
    assert any(not torch.equal(tuned[key], pretrained[key]) for key in changed)
    log = (tuned_run / "train.log").read_text()
    assert "fine-tuning method heads:" in log


def model_section(model):
    return registry.architecture_of(model.hypers).options_from(model.hypers)


def under_adapter(name: str, state: dict) -> str:
    """A pretrained parameter's name in a model whose map it sits in is adapted."""
    if name in state:
        return name
    module, _, leaf = name.rpartition(".")
    return f"{module}.base.{leaf}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_lora_trains_adapters_only_and_exports_them_merged(name, tmp_path, trained_runs):
    """On one process: two processes train lora's one-process model (a stopped lora run
    resumed on two, tests/integration/test_finetune_heads.py), and heads fine-tuning's
    frozen parameters are checked on two here."""
    run = trained_runs(name)
    pretrained = {k: p.detach() for k, p in best_model(run / "best.ckpt").named_parameters()}
    finetune = {"read_from": str(run / "best.ckpt"), "method": "lora", "config": {"rank": 2}}
    options = options_for(tmp_path / "second", name, architecture__training__finetune=finetune)
    tuned_run = train(tmp_path / "second", options)
    tuned = best_model(tuned_run / "best.ckpt")
    state = tuned.state_dict()
    assert any("lora" in key and state[key].abs().max() > 0 for key in state)
    for key, value in pretrained.items():
        assert torch.equal(state[under_adapter(key, state)], value), key
    # the export, adapters merged, is the adapted model
    atoms = molecule()
    ours = predictions(tuned, atoms)
    exported = load_exported(tuned_run / "model.pt")
    theirs = predictions(exported, atoms)
    assert theirs["energy"][0] == pytest.approx(ours["energy"][0], rel=1e-10)
    np.testing.assert_allclose(theirs["forces"], ours["forces"], rtol=1e-8, atol=1e-9)
