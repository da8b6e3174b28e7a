"""Molecular dynamics speed in ASE: atomtrain's exported model through metatomic, against
metatrain's SOAP-BPNN with the same hyperparameters through metatomic, and against
atomtrain's own calculator.

    python benchmarks/md_speed.py [--steps 300] [--repeats 3]

Trains both tools for one epoch on the same options (compare_metatrain.py's, the
ethanol example's hyperparameters: cutoff 5, max_radial 7, max_angular 6, 2 x 32
neurons, float32) for ethanol and for silicon, then runs velocity-Verlet MD (0.5 fs) on
an ethanol molecule (9 atoms) and on a rattled 64-atom diamond silicon cell, each in a
fresh process: --steps timed after 20 warm-up steps, median over --repeats, the engines
alternated; and the model alone (forward and backward through metatomic's
AtomisticModel, neighbor list given: no ASE, no neighbor search); and a trivial model
(energy: a sum over the same neighbor list) through metatomic, the engine's own cost per
step, which bounds what any model can reach in this engine. Conditions: one torch
thread; and torch's default threads (all cores) while another process keeps one core
busy. Everything runs with the interpreter of
benchmarks/.venv-metatrain (built as compare_metatrain.py builds it), so that both
models load in the same metatomic. With --calculator-before COMMIT, also
atomtrain.ase.Calculator as it was at COMMIT (a git worktree; the model trained there on
the same options): e8bb724 is the last commit before the model became a metatomic one.
Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import ase.build
import ase.io

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_metatrain import ROOT, VENV, ensure_metatrain, write_inputs  # noqa: E402

PYTHON = VENV / "bin" / "python"

MD_RUN = """
import json, sys, time
import ase.io, numpy, torch
from ase import units
from ase.md.verlet import VelocityVerlet
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
engine, model, structure, threads, steps = sys.argv[1:6]
if threads != "default":
    torch.set_num_threads(int(threads))
atoms = ase.io.read(structure)
if engine == "atomtrain.ase":
    from atomtrain.ase import Calculator
    atoms.calc = Calculator(model, threads=None)
else:
    from metatomic_ase import MetatomicCalculator
    extensions = model.rsplit("/", 1)[0] + "/extensions"
    atoms.calc = MetatomicCalculator(model, extensions_directory=extensions)
MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=numpy.random.default_rng(0))
dynamics = VelocityVerlet(atoms, 0.5 * units.fs)
dynamics.run(20)
start = time.perf_counter()
dynamics.run(int(steps))
print(json.dumps({"steps_per_second": int(steps) / (time.perf_counter() - start),
                  "threads": torch.get_num_threads()}))
"""

# the model alone: forward and backward through metatomic's AtomisticModel on a system
# whose neighbor list is already computed (no ASE, no neighbor search), per second
MODEL_ALONE = """
import json, sys, time
import ase.io, torch
from metatomic.torch import (ModelEvaluationOptions, ModelOutput, load_atomistic_model,
                             systems_to_torch)
from vesin.metatomic import compute_requested_neighbors
_, model_path, structure, threads, steps = sys.argv[1:6]
if threads != "default":
    torch.set_num_threads(int(threads))
extensions = model_path.rsplit("/", 1)[0] + "/extensions"
model = load_atomistic_model(model_path, extensions_directory=extensions)
dtype = getattr(torch, model.capabilities().dtype)  # what the model asks engines for
system = systems_to_torch(ase.io.read(structure), dtype=dtype, positions_requires_grad=True)
compute_requested_neighbors(system, system_length_unit="angstrom", model=model)
options = ModelEvaluationOptions(length_unit="angstrom",
                                 outputs={"energy": ModelOutput(unit="eV")})
def call():
    energy = model([system], options, check_consistency=False)["energy"].block().values
    torch.autograd.grad(energy.sum(), system.positions, retain_graph=True)
for _ in range(20):
    call()
start = time.perf_counter()
for _ in range(int(steps)):
    call()
print(json.dumps({"steps_per_second": int(steps) / (time.perf_counter() - start),
                  "threads": torch.get_num_threads()}))
"""

# the engine's own cost per step: a model whose energy is a sum over the same neighbor
# list (half, strict, the same cutoff, float64), three operations; no model can make
# an MD step through this engine faster than this one does
TRIVIAL_MODEL = """
import sys
from typing import Dict, List, Optional
import torch
from metatensor.torch import Labels, TensorBlock, TensorMap
from metatomic.torch import (AtomisticModel, ModelCapabilities, ModelMetadata,
                             ModelOutput, NeighborListOptions, System, load_atomistic_model)


class Trivial(torch.nn.Module):
    def __init__(self, cutoff: float):
        super().__init__()
        self.neighbors = NeighborListOptions(cutoff=cutoff, full_list=False, strict=True,
                                             requestor="trivial")

    def requested_neighbor_lists(self) -> List[NeighborListOptions]:
        return [self.neighbors]

    def forward(self, systems: List[System], outputs: Dict[str, ModelOutput],
                selected_atoms: Optional[Labels] = None) -> Dict[str, TensorMap]:
        energies: List[torch.Tensor] = []
        for system in systems:
            vectors = system.get_neighbor_list(self.neighbors).values
            energies.append((1e-3 * vectors * vectors).sum().reshape(1, 1))
        zero = torch.zeros((1, 1), dtype=torch.int32)
        samples = Labels(["system"], torch.arange(len(systems), dtype=torch.int32).reshape(-1, 1))
        block = TensorBlock(torch.cat(energies), samples, [], Labels(["energy"], zero))
        return {"energy": TensorMap(Labels(["_"], zero), [block])}


path, like = sys.argv[1], sys.argv[2]  # the cutoff and elements of the model at like
found = load_atomistic_model(like, extensions_directory=like.rsplit("/", 1)[0] + "/extensions")
cutoff = found.capabilities().interaction_range
capabilities = ModelCapabilities(
    outputs={"energy": ModelOutput(unit="eV")},
    atomic_types=found.capabilities().atomic_types,
    interaction_range=cutoff, length_unit="angstrom", supported_devices=["cpu"],
    dtype="float64")
AtomisticModel(Trivial(cutoff).eval(), ModelMetadata(name="trivial"), capabilities).save(path)
"""

BUSY_LOOP = "while True: pass"


@contextmanager
def busy_core(active: bool):
    process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if active else None
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.wait()


def train_both(directory: Path, name: str, mtt: Path) -> dict[str, Path]:
    """One epoch of each tool on the same options; their exported models."""
    models = {}
    for tool in ("metatrain", "atomtrain"):
        workdir = directory / f"{name}-{tool}"
        workdir.mkdir()
        options = write_inputs(workdir, name, count=40, epochs=1, batch=8)
        if tool == "metatrain":
            command = [str(mtt), "train", options.name, "-o", "model.pt"]
        else:
            command = ["atomtrain", "train", options.name, "-o", "model.pt"]
        subprocess.run(command, cwd=workdir, check=True, capture_output=True)
        models[tool] = workdir / "model.pt"
    return models


def trivial_model(directory: Path, name: str, like: Path) -> Path:
    """TRIVIAL_MODEL with the cutoff and elements of the model at ``like``."""
    workdir = directory / f"{name}-trivial"
    (workdir / "extensions").mkdir(parents=True)
    (workdir / "build.py").write_text(TRIVIAL_MODEL)  # TorchScript reads its source
    model = workdir / "model.pt"
    subprocess.run(
        [str(PYTHON), "build.py", str(model), str(like)],
        cwd=workdir,
        capture_output=True,
        check=True,
    )
    return model


def structures(directory: Path) -> dict[str, Path]:
    ethanol = ase.io.read(ROOT / "examples" / "ethanol" / "ethanol_1000.xyz", 0)
    ethanol.calc = None
    silicon = ase.build.bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)
    silicon.rattle(0.05, seed=1)
    paths = {}
    for name, atoms in (("ethanol", ethanol), ("silicon", silicon)):
        paths[name] = directory / f"{name}_start.extxyz"
        ase.io.write(paths[name], atoms)
    return paths


@contextmanager
def worktree(commit: str | None, path: Path):
    """Source of a checkout of ``commit`` at ``path`` (None: no checkout), removed
    afterwards."""
    if commit is None:
        yield None
        return
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield path / "src"
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            capture_output=True,
        )


def train_before(directory: Path, name: str, source: Path) -> Path:
    """One epoch of atomtrain as it was at an earlier commit (its source at ``source``),
    on the same options as train_both's; its model.pt."""
    workdir = directory / f"{name}-before"
    workdir.mkdir()
    options = write_inputs(workdir, name, count=40, epochs=1, batch=8)
    command = [sys.executable, "-m", "atomtrain", "train", options.name, "-o", "model.pt"]
    environment = {**os.environ, "PYTHONPATH": str(source)}
    subprocess.run(command, cwd=workdir, check=True, capture_output=True, env=environment)
    return workdir / "model.pt"


def md_speed(
    engine: str,
    model: Path,
    structure: Path,
    threads: str,
    steps: int,
    source: Path | None = None,
) -> dict:
    """Steps per second of ``engine``; ``source``: atomtrain's source to import (an
    earlier commit's) instead of the installed one."""
    script = MODEL_ALONE if engine == "model alone" else MD_RUN
    environment = dict(os.environ)
    if source is not None:
        environment["PYTHONPATH"] = str(source)
    result = subprocess.run(
        [str(PYTHON), "-c", script, engine, str(model), str(structure), threads, str(steps)],
        capture_output=True,
        text=True,
        env=environment,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} on {model}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--calculator-before",
        metavar="COMMIT",
        help="also time atomtrain.ase.Calculator as it was at COMMIT (e.g. e8bb724)",
    )
    arguments = parser.parse_args()
    mtt = ensure_metatrain()
    cases = [
        ("atomtrain", "metatomic"),
        ("metatrain", "metatomic"),
        ("atomtrain", "atomtrain.ase"),
        ("atomtrain", "model alone"),
        ("metatrain", "model alone"),
        ("trivial", "metatomic"),
    ]
    conditions = [("1 thread", "1", False), ("all cores, one busy", "default", True)]
    if arguments.calculator_before:
        cases.append(("before", "atomtrain.ase"))
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        starts = structures(directory)
        rows = []
        with worktree(arguments.calculator_before, directory / "before") as before:
            for name in ("ethanol", "silicon"):
                models = train_both(directory, name, mtt)
                models["trivial"] = trivial_model(directory, name, models["atomtrain"])
                if before is not None:
                    models["before"] = train_before(directory, name, before)
                for label, threads, busy in conditions:
                    speeds, used = time_cases(
                        cases, models, starts[name], threads, busy, arguments, before
                    )
                    medians = {case: statistics.median(values) for case, values in speeds.items()}
                    rows.append((name, label, medians, used))
                    print_row(name, label, medians, used, speeds)
    print_table(rows)


def time_cases(cases, models, start, threads, busy, arguments, before):
    """Steps per second of each case, --repeats times, the cases alternated."""
    speeds: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    used = {}
    with busy_core(busy):
        for _ in range(arguments.repeats):
            for tool, engine in cases:
                source = before if tool == "before" else None
                result = md_speed(engine, models[tool], start, threads, arguments.steps, source)
                speeds[(tool, engine)].append(result["steps_per_second"])
                used[(tool, engine)] = result["threads"]
    return speeds, used


def print_table(rows) -> None:
    print()
    print(
        "| system | condition | atomtrain via metatomic | metatrain via metatomic | ratio "
        "| atomtrain.ase.Calculator | metatomic / own | model alone: atomtrain, metatrain, "
        "ratio | calculator before metatomic | metatomic / before | trivial model via "
        "metatomic (the engine's own cost) | trivial / metatrain (the most any model "
        "reaches) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, label, medians, _ in rows:
        mine = medians[("atomtrain", "metatomic")]
        theirs = medians[("metatrain", "metatomic")]
        own = medians[("atomtrain", "atomtrain.ase")]
        alone = medians[("atomtrain", "model alone")]
        alone_theirs = medians[("metatrain", "model alone")]
        trivial = medians[("trivial", "metatomic")]
        print(
            f"| {name} | {label} | {mine:.0f}/s | {theirs:.0f}/s | {mine / theirs:.2f}x | "
            f"{own:.0f}/s | {mine / own:.2f}x | {alone:.0f}/s, {alone_theirs:.0f}/s, "
            f"{alone / alone_theirs:.2f}x | "
            + before_columns(mine, medians)
            + f" {trivial:.0f}/s | {trivial / theirs:.2f}x |"
        )


def before_columns(mine: float, medians) -> str:
    before = medians.get(("before", "atomtrain.ase"))
    if before is None:
        return "- | - |"
    return f"{before:.0f}/s | {mine / before:.2f}x |"


def print_row(name, label, medians, used, speeds) -> None:
    for (tool, engine), median in medians.items():
        values = ", ".join(f"{value:.0f}" for value in speeds[(tool, engine)])
        print(
            f"{name:8s} {label:20s} {tool:9s} via {engine:14s} {median:8.1f} steps/s "
            f"(runs: {values}; torch threads {used[(tool, engine)]})",
            flush=True,
        )


if __name__ == "__main__":
    main()
