"""The exported metatomic model on the GPU, through metatomic-ase (the engine's path:
its neighbor list, autograd through it), gives the CPU's energy and forces on the first
structure of DATA. Part of scripts/gpu_check.sh.

    python scripts/gpu_metatomic_matches_cpu.py MODEL DATA [--tolerance 1e-3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ase.io
import numpy as np
from metatomic_ase import MetatomicCalculator


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    arguments = parser.parse_args()
    atoms = ase.io.read(arguments.data, 0)
    extensions = Path(arguments.model).parent / "extensions"
    results = {}
    for device in ("cpu", "cuda"):
        atoms.calc = MetatomicCalculator(
            arguments.model, extensions_directory=str(extensions), device=device
        )
        results[device] = (atoms.get_potential_energy(), atoms.get_forces())
    energy = abs(results["cpu"][0] - results["cuda"][0])
    forces = float(np.abs(results["cpu"][1] - results["cuda"][1]).max())
    print(
        f"gpu_check: metatomic {arguments.model} on cuda vs cpu: energy {energy:.2e} eV, "
        f"forces {forces:.2e} eV/A"
    )
    return 0 if max(energy, forces) < arguments.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
