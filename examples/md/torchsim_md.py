"""Molecular dynamics with an exported atomtrain model in TorchSim, through metatomic.

    python torchsim_md.py ../ethanol/model.pt --ensemble nve --steps 1000
    python torchsim_md.py ../ethanol/model.pt --ensemble nvt --temperature 300

TorchSim (``pip install torch-sim-atomistic metatomic-torchsim``; TorchSim 0.5 and later
need Python 3.12) loads the model through metatomic-torchsim's MetatomicModel: this
script does not import atomtrain. It first checks TorchSim's energy, forces and (for
periodic cells) stress at the starting positions against metatomic-ase's calculator on
the same file, then writes md_torchsim_<ensemble>.csv and .png as ase_md.py does, and
prints the largest change of the total energy in meV per atom.
"""

from __future__ import annotations

import importlib.util
import sys

# said before torch's import (seconds): one line, as for the examples' other missing
# inputs, not a traceback
for _needed in ("torch_sim", "metatomic_torchsim"):
    if importlib.util.find_spec(_needed) is None:
        print(
            f"{_needed} is not installed: this example needs TorchSim and metatomic-torchsim "
            "(pip install torch-sim-atomistic metatomic-torchsim; TorchSim 0.5 and later need "
            "Python 3.12)",
            file=sys.stderr,
        )
        sys.exit(2)

import time  # noqa: E402

import ase.io  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_sim  # noqa: E402
from ase_md import md_arguments, report, torch_settings  # noqa: E402
from metatomic_ase import MetatomicCalculator  # noqa: E402
from metatomic_torchsim import MetatomicModel  # noqa: E402
from torch_sim.integrators import (  # noqa: E402
    nve_init,
    nve_step,
    nvt_langevin_init,
    nvt_langevin_step,
)
from torch_sim.units import MetalUnits  # noqa: E402


def check_against_ase(model: MetatomicModel, atoms: ase.Atoms, arguments) -> None:
    """TorchSim's and metatomic-ase's predictions on the same file and positions: the
    same model run by two engines, each with its own neighbor list."""
    state = torch_sim.initialize_state(atoms, device=model.device, dtype=model.dtype)
    predicted = model(state)
    reference = atoms.copy()
    reference.calc = MetatomicCalculator(
        str(arguments.model), extensions_directory=str(arguments.model.parent / "extensions")
    )
    differences = {
        "energy (eV)": abs(float(predicted["energy"][0]) - reference.get_potential_energy()),
        "forces (eV/A)": np.abs(
            predicted["forces"].detach().numpy() - reference.get_forces()
        ).max(),
    }
    if atoms.pbc.all():
        differences["stress (eV/A^3)"] = np.abs(
            predicted["stress"][0].detach().numpy() - reference.get_stress(voigt=False)
        ).max()
    print(
        "TorchSim against metatomic-ase at the starting positions, largest difference: "
        + ", ".join(f"{name} {value:.2e}" for name, value in differences.items())
    )
    if max(differences.values()) > 1e-8:
        sys.exit("TorchSim and metatomic-ase disagree on the same model: see above")


def main() -> None:
    arguments = md_arguments(__doc__.split("\n\n")[0])
    torch_settings(arguments.threads)
    atoms = ase.io.read(arguments.structure, index=0)
    # metatomic wants no cell vector along a direction that is not periodic (the bundled
    # molecules carry a box); metatomic-ase drops them itself, TorchSim does not
    atoms.cell.array[~atoms.pbc] = 0.0
    periodic = bool(atoms.pbc.all())
    # the extensions the model needs (sphericart) were collected beside it at export
    model = MetatomicModel(
        str(arguments.model),
        extensions_directory=str(arguments.model.parent / "extensions"),
        device="cpu",
        compute_stress=periodic,
    )
    check_against_ase(model, atoms, arguments)
    state = torch_sim.initialize_state(atoms, device=model.device, dtype=model.dtype)
    state.rng = arguments.seed
    kT = torch.tensor(arguments.temperature * MetalUnits.temperature, dtype=model.dtype)
    timestep = torch.tensor(arguments.timestep * 1e-3 * MetalUnits.time, dtype=model.dtype)
    if arguments.ensemble == "nve":
        state = nve_init(state, model, kT=kT)

        def step(state):
            return nve_step(state, model, dt=timestep)
    else:
        state = nvt_langevin_init(state, model, kT=kT)
        # TorchSim's friction is in 1/ps in metal units
        gamma = torch.tensor(arguments.friction * 1e3 / MetalUnits.time, dtype=model.dtype)

        def step(state):
            return nvt_langevin_step(state, model, dt=timestep, kT=kT, gamma=gamma)

    rows: list[dict[str, float]] = []
    start = time.perf_counter()
    for number in range(arguments.steps + 1):
        if number > 0:
            state = step(state)
        potential = float(state.energy[0])
        kinetic = float(
            torch_sim.quantities.calc_kinetic_energy(masses=state.masses, momenta=state.momenta)
        )
        rows.append(
            {
                "time_fs": number * arguments.timestep,
                "total_eV": potential + kinetic,
                "potential_eV": potential,
                "kinetic_eV": kinetic,
                "temperature_K": float(state.calc_temperature()[0]),
            }
        )
    speed = arguments.steps / (time.perf_counter() - start)
    report(rows, arguments, len(atoms), "TorchSim", speed)


if __name__ == "__main__":
    main()
