#!/usr/bin/env bash
# The CUDA path in one short run, for a machine with a GPU (CI has none):
#
#     bash scripts/gpu_check.sh [WORKDIR]
#
# 1. the model on the GPU gives the CPU's energies, forces, stress and parameter
#    gradients of a force loss, in float64;
# 2. one process trains the ethanol example on the GPU for two epochs, and
#    `atomtrain eval` runs the exported model there;
# 3. torchrun with one process per visible GPU trains the same options (NCCL between
#    the processes when there are two GPUs or more; with one, a single process);
# 4. the exported metatomic model runs on the GPU through metatomic-ase.
# Each step prints what it checked; the script stops at the first failure.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
GPUS="$(python -c 'import torch; print(torch.cuda.device_count())')"
if [ "$GPUS" -lt 1 ]; then
    echo "gpu_check: torch sees no GPU (torch.cuda.device_count() is 0)" >&2
    exit 1
fi
echo "gpu_check: $GPUS GPU(s), torch $(python -c 'import torch; print(torch.__version__)'), work in $WORK"

python "$ROOT/scripts/gpu_matches_cpu.py" "$ROOT/examples/silicon/si_train.xyz"
python "$ROOT/scripts/gpu_matches_cpu.py" "$ROOT/examples/ethanol/ethanol_1000.xyz"

cp "$ROOT/examples/ethanol/options.yaml" "$ROOT/examples/ethanol/ethanol_1000.xyz" "$WORK/"
cd "$WORK"
OVERRIDES=(-r device=cuda -r architecture.training.num_epochs=2 -r architecture.training.log_interval=1)
time atomtrain train options.yaml -o single.pt "${OVERRIDES[@]}"
time atomtrain eval single.pt ethanol_1000.xyz -o predictions.xyz
time torchrun --standalone --nproc_per_node "$GPUS" -m atomtrain train options.yaml -o torchrun.pt "${OVERRIDES[@]}"
# 4. the exported metatomic model on the GPU through metatomic-ase gives the CPU's
#    energy and forces (the engine's path: neighbor list, autograd through it)
python - single.pt <<'PYTHON'
import sys
import ase.io
import numpy as np
from metatomic_ase import MetatomicCalculator
model = sys.argv[1]
atoms = ase.io.read("ethanol_1000.xyz", 0)
results = {}
for device in ("cpu", "cuda"):
    atoms.calc = MetatomicCalculator(model, extensions_directory="extensions", device=device)
    results[device] = (atoms.get_potential_energy(), atoms.get_forces())
energy = abs(results["cpu"][0] - results["cuda"][0])
forces = np.abs(results["cpu"][1] - results["cuda"][1]).max()
print(f"gpu_check: metatomic on cuda vs cpu: energy {energy:.2e} eV, forces {forces:.2e} eV/A")
assert energy < 1e-3 and forces < 1e-3, "the metatomic model on the GPU differs from the CPU"
PYTHON
echo "gpu_check: all steps passed"
