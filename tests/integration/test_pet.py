"""PET (metatrain's PETBackend) through atomtrain: metatrain's own options and
checkpoints. A small PET is trained here by metatrain's ``mtt train``; atomtrain reads
its checkpoint without running pickled code and predicts what metatrain's exported
model predicts, evaluates it, and fine-tunes it."""

from __future__ import annotations

import os
import subprocess
import sys

import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.cli.main import main
from atomtrain.errors import AtomtrainError
from atomtrain.models import metatrain_checkpoint
from atomtrain.training.checkpoint import best_model, load_checkpoint

from conftest import RESOURCES
from helpers import ENGINE_SETTINGS, TINY_PET, run_directories, run_model, structure_from_atoms

ETHANOL = RESOURCES / "ethanol_40.xyz"
MTT = [sys.executable, "-m", "metatrain"]

METATRAIN_OPTIONS = {
    "seed": 1,
    "base_precision": 64,
    "architecture": {
        "name": "pet",
        "model": TINY_PET,
        "training": {"batch_size": 8, "num_epochs": 2},
    },
    "training_set": {
        "systems": str(ETHANOL),
        "targets": {
            "energy": {"key": "energy", "unit": "eV", "forces": {"key": "forces"}},
            # PET-MAD's and UPET's direct forces: read past, their energy read
            "non_conservative_forces": {
                "key": "forces",
                "type": {"cartesian": {"rank": 1}},
                "per_atom": True,
                "quantity": "force",
                "unit": "eV/A",
            },
        },
    },
    "validation_set": 0.2,
    "test_set": 0.1,
}


@pytest.fixture(scope="module")
def mtt_pet(tmp_path_factory):
    """(model.ckpt, model.pt) of a small float64 PET trained by metatrain's mtt train."""
    directory = tmp_path_factory.mktemp("mtt_pet")
    (directory / "options.yaml").write_text(yaml.safe_dump(METATRAIN_OPTIONS))
    result = subprocess.run(
        [*MTT, "train", "options.yaml"], cwd=directory, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return directory / "model.ckpt", directory / "model.pt"


METATOMIC_PREDICTIONS = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic_ase import MetatomicCalculator
calculator = MetatomicCalculator(sys.argv[1])
found = []
for atoms in ase.io.read(sys.argv[2], ":5"):
    atoms.calc = calculator
    found.append({"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().tolist()})
print(json.dumps({"found": found, "atomtrain": "atomtrain" in sys.modules}))
"""
)


@pytest.mark.slow
def test_a_metatrain_pet_checkpoint_predicts_what_metatrains_export_of_it_does(mtt_pet):
    """Weights, composition baseline and scale kept: atomtrain's model of the .ckpt gives
    the energies and forces of the model.pt metatrain exported from it, run by
    metatomic in a process without atomtrain, to 1e-6 relative in float64."""
    checkpoint, exported = mtt_pet
    result = subprocess.run(
        [sys.executable, "-c", METATOMIC_PREDICTIONS, str(exported), str(ETHANOL)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = yaml.safe_load(result.stdout.strip().splitlines()[-1])
    assert not theirs["atomtrain"]
    model = best_model(checkpoint)
    assert next(model.parameters()).dtype == torch.float64
    assert model.hypers["model"]["d_pet"] == TINY_PET["d_pet"]
    for atoms, expected in zip(ase.io.read(ETHANOL, ":5"), theirs["found"]):
        ours = run_model(model, [structure_from_atoms(atoms)])
        energy = float(ours["energy"][0].detach())
        assert energy == pytest.approx(expected["energy"], rel=1e-6, abs=0)
        forces = ours["forces"].detach().numpy()
        scale = np.abs(expected["forces"]).max()
        assert np.abs(forces - np.array(expected["forces"])).max() <= 1e-6 * scale
    assert not any(name.startswith("metatrain.utils.data") for name in sys.modules)


@pytest.mark.slow
def test_eval_and_fine_tuning_start_from_a_metatrain_pet_checkpoint(mtt_pet, tmp_path, capsys):
    checkpoint, _ = mtt_pet
    predictions = tmp_path / "predictions.xyz"
    assert main(["eval", str(checkpoint), str(ETHANOL), "-o", str(predictions)]) == 0
    model = best_model(checkpoint)
    atoms = ase.io.read(predictions, index=3)
    ours = run_model(model, [structure_from_atoms(ase.io.read(ETHANOL, index=3))])
    predicted = float(ours["energy"][0].detach())
    assert atoms.info["predicted_energy"] == pytest.approx(predicted, rel=1e-9, abs=0)

    options = {
        "seed": 2,
        "architecture": {
            "name": "pet",
            "training": {
                "batch_size": 8,
                "num_epochs": 1,
                "finetune": {"method": "full", "read_from": str(checkpoint)},
            },
        },
        "training_set": {"systems": str(ETHANOL), "targets": {"energy": {"key": "energy"}}},
        "validation_set": 0.2,
        "test_set": 0.1,
    }
    (tmp_path / "options.yaml").write_text(yaml.safe_dump(options))
    outputs = tmp_path / "outputs"
    assert main(["train", str(tmp_path / "options.yaml"), "--outputs", str(outputs)]) == 0
    (run,) = run_directories(outputs)
    log = (run / "train.log").read_text()
    assert f"fine-tuning the best model of {checkpoint}" in log
    assert "its direct heads (non_conservative_forces) left out" in log
    assert "model: PET" in log
    # atomtrain's own checkpoints still load with weights_only=True, and reading
    # metatrain's left no class allowed beyond the read
    assert load_checkpoint(run / "best.ckpt").architecture == "pet"
    assert metatrain_checkpoint.DatasetInfo not in torch.serialization.get_safe_globals()
    assert torch.load(run / "best.ckpt", weights_only=True)["architecture"] == "pet"


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-while-loading",))


def test_a_metatrain_like_checkpoint_with_other_objects_is_refused_not_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "model.ckpt"
    torch.save({"architecture_name": "pet", "model_ckpt_version": 16, "x": RunsCode()}, path)
    assert main(["eval", str(path), str(ETHANOL), "-o", "p.xyz"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "model.ckpt" in error and "not read it as pickle" in error
    assert not (tmp_path / "ran-while-loading").exists()


def test_a_metatrain_checkpoint_of_another_architecture_is_named(capsys, tmp_path):
    """The bundled SOAP-BPNN checkpoint written by mtt train."""
    path = RESOURCES / "metatrain" / "model.ckpt"
    with pytest.raises(AtomtrainError, match="of architecture 'soap_bpnn'; atomtrain reads"):
        best_model(path)


@pytest.mark.slow
def test_a_metatrain_pet_checkpoint_of_another_version_says_both(mtt_pet, tmp_path):
    import metatrain.pet  # noqa: F401  (the classes metatrain's own loading needs)

    checkpoint, _ = mtt_pet
    loaded = torch.load(checkpoint, weights_only=False)
    loaded["model_ckpt_version"] = 12
    older = tmp_path / "older.ckpt"
    torch.save(loaded, older)
    with pytest.raises(AtomtrainError, match="model version 12; atomtrain reads version 16"):
        best_model(older)


def test_pet_without_metatrain_says_what_to_install(tmp_path):
    """A process where metatrain cannot be imported: one line naming the extra."""
    script = (
        "import sys; sys.modules['metatrain'] = None\n"
        "from atomtrain.models import registry\n"
        "registry.new_model('pet', [1, 6, 8])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "pip install atomtrain[pet]" in result.stderr.strip().splitlines()[-1]
