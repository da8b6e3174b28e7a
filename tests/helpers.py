"""Small shared helpers for the tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import ase
import pytest
import torch

from atomtrain.data import collate, read_structures
from atomtrain.data.system import Structure
from atomtrain.models.soap_bpnn.model import SoapBpnn
from atomtrain.models.soap_bpnn.options import ModelOptions
from atomtrain.training.evaluation import predict

# a small SOAP-BPNN's model section, so that the tests run fast
SMALL_MODEL = {
    "soap": {"cutoff": {"radius": 4.0, "width": 0.5}, "max_radial": 3, "max_angular": 3},
    "bpnn": {"num_hidden_layers": 2, "num_neurons_per_layer": 16},
}


# a small MACE's model section (mace-torch), for the same reason
TINY_MACE = {
    "r_max": 4.0,
    "num_radial_basis": 4,
    "max_ell": 2,
    "hidden_irreps": "4x0e + 4x1o",
    "correlation": 2,
    "num_interactions": 2,
    "radial_MLP": [8],
    "MLP_irreps": "4x0e",
}

# a small PET's model section (metatrain's PETBackend), for the same reason
TINY_PET = {
    "cutoff": 4.0,
    "d_pet": 16,
    "d_head": 16,
    "d_node": 16,
    "d_feedforward": 32,
    "num_heads": 2,
    "num_attention_layers": 1,
    "num_gnn_layers": 2,
}


# The first lines of the tests' engine scripts (processes without atomtrain that run an
# exported model through metatomic): what docs/engines.md advises on a CPU, no shape
# specializations (seconds of MACE's and PET's first calls). i-PI's driver, in the i-PI
# test, runs with torch's default.
ENGINE_SETTINGS = """
import torch, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.jit.set_fusion_strategy([("STATIC", 0), ("DYNAMIC", 0)])
"""


def small_model(atomic_types, dtype=torch.float64, seed=0) -> SoapBpnn:
    torch.manual_seed(seed)
    model = SoapBpnn(atomic_types, ModelOptions.model_validate(SMALL_MODEL)).set_precision(dtype)
    # non-trivial baseline and scale, so that they are exercised too
    model.set_baseline(torch.linspace(-3.0, -1.0, len(model.atomic_types)), 0.7)
    return model


def structure_from_atoms(atoms: ase.Atoms) -> Structure:
    return Structure(
        positions=torch.tensor(atoms.positions, dtype=torch.float64),
        atomic_numbers=torch.tensor(atoms.numbers, dtype=torch.long),
        cell=torch.tensor(atoms.cell.array, dtype=torch.float64),
        pbc=torch.tensor(atoms.pbc),
    )


def run_model(
    model, structures, forces=True, stress=False, dtype=torch.float64, create_graph=False
):
    batch = collate(structures, model.cutoff).to("cpu", dtype)
    return predict(model, batch, forces, stress, create_graph)


def read(path, **keys):
    return read_structures(path, **keys)


def write_options(directory, data_file, **changes):
    """A small, fast options file (float64, tiny SOAP) in ``directory``."""
    import yaml

    options = {
        "seed": 5,
        "device": "cpu",
        "base_precision": 64,
        "architecture": {
            "name": "soap_bpnn",
            "model": {
                "soap": {
                    "cutoff": {"radius": 4.0, "width": 0.5},
                    "max_radial": 3,
                    "max_angular": 3,
                },
                "bpnn": {"num_hidden_layers": 2, "num_neurons_per_layer": 16},
            },
            "training": {
                "batch_size": 6,
                "num_epochs": 3,
                "learning_rate": 0.005,
                "checkpoint_interval": 2,
            },
        },
        "training_set": {"systems": {"read_from": str(data_file)}},
        "validation_set": 0.2,
        "test_set": 0.1,
        # tests of other things need no event files (their import costs 0.2-0.3 s a run)
        # nor figures (a child process with matplotlib, 0.8 s of CPU a run); the tests of
        # those turn them on (test_experiment_logs.py, test_cli.py, test_targets.py)
        "logging": {"tensorboard": False, "figures": False},
    }
    for dotted, value in changes.items():
        target = options
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def checkpoint_weights(path):
    import torch

    return torch.load(path, weights_only=True)["best_model_state"]


def run_directories(outputs):
    return sorted(path.parent for path in outputs.glob("*/*/train.log"))


# processes launched as srun would launch them (SLURM variables, no srun needed)


def environment(**extra):
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(
            ("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")
        )
    }
    return {**clean, "PYTHONUNBUFFERED": "1", **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start_ranks(command, world_size=2, **extra):
    """Start one process per rank, as srun would (SLURM variables, no srun needed)."""
    port = free_port()
    processes = []
    for rank in range(world_size):
        env = environment(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(world_size),
            SLURM_LOCALID=str(rank),
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            **extra,
        )
        processes.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return processes


def finish(processes, limit=120):
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"process {process.pid} did not exit: {err[-2000:]}")
        results.append((process.returncode, out, err))
    return results


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc): the --nproc launcher's or a
    conversion's workers."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def slurm_available() -> bool:
    """A SLURM that runs jobs here (bash .ci/setup_slurm.sh starts one; CI does)."""
    if shutil.which("srun") is None:
        return False
    try:
        probe = subprocess.run(["srun", "-N1", "-n1", "true"], capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0
