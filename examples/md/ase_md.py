"""Molecular dynamics with an exported atomtrain model in ASE, through metatomic.

    python ase_md.py ../ethanol/model.pt --ensemble nve --steps 1000
    python ase_md.py ../ethanol/model.pt --ensemble nvt --temperature 300
    python ase_md.py model.pt --non-conservative     # a model with direct forces

The model runs through metatomic-ase's MetatomicCalculator: this script does not import
atomtrain. It writes md_<ensemble>.csv (time, total, potential and kinetic energy,
temperature) and md_<ensemble>.png (total energy and temperature over time), and prints
the largest change of the total energy in meV per atom.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
import warnings
from pathlib import Path

# torch, ASE, metatomic and matplotlib are imported where they are used, after the
# arguments are checked: a wrong path is said at once, not after seconds of imports

HERE = Path(__file__).resolve().parent


def md_arguments(description: str) -> argparse.Namespace:
    """The options of this script and of torchsim_md.py; a missing file is one line and
    exit code 2, before anything loads."""
    arguments = md_parser(description).parse_args()
    extensions = arguments.model.parent / "extensions"
    for path, what in [
        (
            arguments.model,
            "model file not found (the README's quick start writes examples/ethanol/model.pt)",
        ),
        (
            extensions,
            "the model's extensions directory is not beside it (export writes "
            "model.pt and extensions/ together; move them together)",
        ),
        (arguments.structure, "structure file not found"),
    ]:
        if not path.exists():
            print(f"{path}: {what}", file=sys.stderr)
            sys.exit(2)
    # the results are written after the last step: an unusable --output is said first
    if not arguments.output.is_dir():
        print(
            f"{arguments.output}: output directory not found; create it (mkdir -p "
            f"{arguments.output}) or give another --output",
            file=sys.stderr,
        )
        sys.exit(2)
    if not os.access(arguments.output, os.W_OK):
        print(f"{arguments.output}: output directory is not writable", file=sys.stderr)
        sys.exit(2)
    return arguments


def md_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", type=Path, help="exported model (model.pt)")
    parser.add_argument(
        "--structure",
        type=Path,
        default=HERE.parent / "ethanol" / "ethanol_1000.xyz",
        help="starting structure: the first frame of this file (default: bundled ethanol)",
    )
    parser.add_argument("--ensemble", choices=["nve", "nvt"], default="nve")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--timestep", type=float, default=0.5, help="fs (default 0.5)")
    parser.add_argument("--temperature", type=float, default=300.0, help="K (default 300)")
    parser.add_argument(
        "--friction", type=float, default=0.01, help="Langevin friction, 1/fs (NVT only)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the fastest measured for small systems, and 4x "
        "faster than torch's default beside another job; docs/performance-notes.md)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("."), help="directory for files")
    parser.add_argument(
        "--non-conservative",
        action="store_true",
        help="forces from the model's direct output (non_conservative_force, a target the "
        "model was trained on) instead of the energy's gradient: no backward pass, but "
        "the total energy drifts (docs/targets.md)",
    )
    return parser


def torch_settings(threads: int) -> None:
    """``threads`` threads; on a machine without a GPU, no specialization of the model's
    TorchScript graph to the shapes of its first calls: the profiling executor makes
    them to fuse operators, and on a CPU it fuses none, so they only cost time: seconds
    of MACE's and PET's first steps (docs/engines.md)."""
    import torch

    torch.set_num_threads(threads)
    if not torch.cuda.is_available():
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript's settings
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.set_fusion_strategy([("STATIC", 0), ("DYNAMIC", 0)])


def main() -> None:
    arguments = md_arguments(__doc__.split("\n\n")[0])
    import ase.io
    import numpy as np
    from ase import units
    from ase.md import velocitydistribution
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, ZeroRotation
    from ase.md.verlet import VelocityVerlet
    from metatomic_ase import MetatomicCalculator

    torch_settings(arguments.threads)
    atoms = ase.io.read(arguments.structure, index=0)
    # the extensions the model needs (sphericart) were collected beside it at export;
    # direct forces with the direct stress where the model has it: metatomic-ase takes a
    # periodic structure's stress with its forces, and by autograd it costs the backward
    # pass that direct forces spare
    modes: list[bool | str] = [True, "forces"] if arguments.non_conservative else [False]
    for mode in modes:
        try:
            atoms.calc = MetatomicCalculator(
                str(arguments.model),
                extensions_directory=str(arguments.model.parent / "extensions"),
                # metatomic-ase would otherwise compute the per-atom energy uncertainty
                # of an atomtrain model (LLPR) at every step and warn above 0.1 eV;
                # atomic energies are not observed, and their uncertainties exceed the
                # structure's (docs/uncertainty.md)
                uncertainty_threshold=None,
                non_conservative=mode,
            )
            break
        except ValueError as error:  # metatomic-ase: the model lacks a direct output
            if mode != modes[-1]:
                continue
            print(
                f"{arguments.model}: {error}; train it with a non_conservative_forces "
                "target (docs/targets.md) or leave out --non-conservative",
                file=sys.stderr,
            )
            sys.exit(2)
    generator = np.random.default_rng(arguments.seed)
    # thermalize_momenta is ASE 3.29's name for MaxwellBoltzmannDistribution
    thermalize = getattr(
        velocitydistribution,
        "thermalize_momenta",
        velocitydistribution.MaxwellBoltzmannDistribution,
    )
    thermalize(atoms, temperature_K=arguments.temperature, rng=generator)
    Stationary(atoms)
    ZeroRotation(atoms)
    timestep = arguments.timestep * units.fs
    if arguments.ensemble == "nve":
        dynamics = VelocityVerlet(atoms, timestep)
    else:
        dynamics = Langevin(
            atoms,
            timestep,
            temperature_K=arguments.temperature,
            friction=arguments.friction / units.fs,
            rng=generator,
            # fixcm=True (ASE's default) samples too hot a distribution for a molecule
            # of 9 atoms: measured 403 K instead of 300 (ASE warns about it since 3.28)
            fixcm=False,
        )
    rows: list[dict[str, float]] = []

    def record() -> None:
        potential = atoms.get_potential_energy()
        kinetic = atoms.get_kinetic_energy()
        rows.append(
            {
                "time_fs": dynamics.get_time() / units.fs,
                "total_eV": potential + kinetic,
                "potential_eV": potential,
                "kinetic_eV": kinetic,
                "temperature_K": atoms.get_temperature(),
            }
        )

    dynamics.attach(record, interval=1)  # called at the start too
    started = time.perf_counter()
    dynamics.run(arguments.steps)
    speed = arguments.steps / (time.perf_counter() - started)
    report(rows, arguments, len(atoms), "ASE", speed)


def report(
    rows: list[dict[str, float]],
    arguments: argparse.Namespace,
    n_atoms: int,
    engine: str,
    speed: float | None = None,
) -> None:
    """Writes the table and the plot, and prints what happened, in one line."""
    import numpy as np

    prefix = "md" if engine == "ASE" else f"md_{engine.lower()}"
    stem = arguments.output / f"{prefix}_{arguments.ensemble}"
    write_table(stem.with_suffix(".csv"), rows)
    title = f"{arguments.ensemble.upper()} molecular dynamics ({engine}, metatomic)"
    plot(stem.with_suffix(".png"), rows, title)
    total = np.array([row["total_eV"] for row in rows])
    change = 1000 * np.abs(total - total[0]).max() / n_atoms
    temperature = np.mean([row["temperature_K"] for row in rows[len(rows) // 2 :]])
    summary = (
        f"largest change of the total energy {change:.4f} meV/atom"
        if arguments.ensemble == "nve"
        else f"target {arguments.temperature:.0f} K"
    )
    rate = f", {speed:.0f} steps/s" if speed is not None else ""
    print(
        f"{arguments.ensemble}: {arguments.steps} steps of {arguments.timestep} fs, "
        f"{n_atoms} atoms{rate}; {summary}; mean temperature (second half) "
        f"{temperature:.0f} K; wrote {stem}.csv and {stem}.png"
    )


def write_table(path: Path, rows: list[dict[str, float]]) -> None:
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(path: Path, rows: list[dict[str, float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    time = [row["time_fs"] for row in rows]
    figure, (energy_axis, temperature_axis) = plt.subplots(2, 1, sharex=True, figsize=(6, 5))
    energy_axis.plot(time, [row["total_eV"] for row in rows])
    energy_axis.set_ylabel("total energy (eV)")
    energy_axis.ticklabel_format(useOffset=True, axis="y")
    temperature_axis.plot(time, [row["temperature_K"] for row in rows])
    temperature_axis.set_ylabel("temperature (K)")
    temperature_axis.set_xlabel("time (fs)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
