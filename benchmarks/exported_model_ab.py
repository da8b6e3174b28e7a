"""The exported SOAP-BPNN at two commits, timed in one process: forward and backward of
atomtrain's metatomic module, batches of the two alternated, so that the machine's
drift (up to 30 % within minutes here) falls on both alike.

    python benchmarks/exported_model_ab.py --before 7f7866b [--after HEAD]

Trains atomtrain for one epoch on md_speed.py's options (ethanol example's
hyperparameters) for ethanol and silicon, scripts the model with each commit's source
(git worktrees; the checkpoint is read by each), and times it on md_speed.py's starting
structures (an ethanol molecule, a rattled 64-atom silicon cell), neighbor list given.
Prints the minimum, first quartile and median over --batches batches of --calls calls,
and each commit's energy and first force (the same model: they agree to float32
rounding). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import ase.io
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_metatrain import ROOT, write_inputs  # noqa: E402
from md_speed import structures, worktree  # noqa: E402


def train(directory: Path, name: str) -> Path:
    workdir = directory / f"{name}-atomtrain"
    workdir.mkdir()
    options = write_inputs(workdir, name, count=40, epochs=1, batch=8)
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", options.name, "--run-dir", "run"],
        cwd=workdir,
        check=True,
        capture_output=True,
    )
    return workdir / "run" / "best.ckpt"


def module_of(source: Path, checkpoint: Path, atoms: ase.Atoms):
    """A call of the metatomic module scripted from ``source`` (forward and backward),
    on ``atoms`` with its neighbor list."""
    from metatomic.torch import ModelOutput, systems_to_torch
    from vesin.metatomic import compute_requested_neighbors

    for name in [name for name in sys.modules if name.split(".")[0] == "atomtrain"]:
        del sys.modules[name]
    sys.path.insert(0, str(source))
    try:
        from atomtrain.models.export import atomistic_model
        from atomtrain.training.checkpoint import best_model

        model = atomistic_model(best_model(checkpoint))
    finally:
        sys.path.remove(str(source))
    inner = torch.jit.script(model).module
    system = systems_to_torch(atoms, dtype=torch.float64, positions_requires_grad=True)
    compute_requested_neighbors(system, system_length_unit="angstrom", model=model)
    outputs = {"energy": ModelOutput(unit="eV")}

    def call():
        energy = inner([system], outputs, None)["energy"].block().values
        forces = -torch.autograd.grad(energy.sum(), system.positions, retain_graph=True)[0]
        return energy, forces

    return call


def compare(calls: dict[str, object], batches: int, size: int) -> dict[str, list[float]]:
    for call in calls.values():
        for _ in range(50):
            call()
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(batches):
        for label, call in calls.items():
            start = time.perf_counter()
            for _ in range(size):
                call()
            times[label].append((time.perf_counter() - start) / size * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a commit")
    parser.add_argument("--after", default=None, help="a commit (default: the working tree)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        starts = structures(directory)
        with worktree(arguments.before, directory / "before") as before:
            with worktree(arguments.after, directory / "after") as after:
                sources = {
                    arguments.before: before,
                    arguments.after or "working tree": after or ROOT / "src",
                }
                for name in ("ethanol", "silicon"):
                    checkpoint = train(directory, name)
                    atoms = ase.io.read(starts[name])
                    calls = {
                        label: module_of(source, checkpoint, atoms)
                        for label, source in sources.items()
                    }
                    for label, call in calls.items():
                        energy, forces = call()
                        print(
                            f"{name} {label}: energy {energy.sum().item():.10f} eV, first "
                            f"force {[round(value, 8) for value in forces[0].tolist()]}"
                        )
                    times = compare(calls, arguments.batches, arguments.calls)
                    for label, values in times.items():
                        values.sort()
                        print(
                            f"{name:8s} {label:14s} forward and backward: min "
                            f"{values[0]:7.0f} us, first quartile "
                            f"{values[len(values) // 4]:7.0f} us, median "
                            f"{values[len(values) // 2]:7.0f} us",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
