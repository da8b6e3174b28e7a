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
# 4. the exported metatomic model runs on the GPU through metatomic-ase;
# 5. a converted (memory-mapped) directory trains on the GPU and gives the xyz file's
#    first-epoch losses;
# 6. training and inference throughput by batch size (benchmarks/gpu_throughput.py).
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

TOLERANCE="${GPU_TOLERANCE:-1e-9}"
python "$ROOT/scripts/gpu_matches_cpu.py" "$ROOT/examples/silicon/si_train.xyz" --tolerance "$TOLERANCE"
python "$ROOT/scripts/gpu_matches_cpu.py" "$ROOT/examples/ethanol/ethanol_1000.xyz" --tolerance "$TOLERANCE"

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
# 5. the memory-mapped directory path on the GPU: one epoch from the directory and from
#    the xyz file, same losses (--float64 keeps the file's float64 energies)
atomtrain convert ethanol_1000.xyz -o ethanol_dir --float64
sed 's/read_from: ethanol_1000.xyz/read_from: ethanol_dir/' options.yaml > options_dir.yaml
ONE_EPOCH=(-r device=cuda -r architecture.training.num_epochs=1 -r architecture.training.log_interval=1)
atomtrain train options.yaml -o from_xyz.pt "${ONE_EPOCH[@]}" 2>&1 | tee from_xyz.log
atomtrain train options_dir.yaml -o from_dir.pt "${ONE_EPOCH[@]}" 2>&1 | tee from_dir.log
EPOCH_LINE='epoch 1/1 |.*| validation: [^|]*'
if ! diff <(grep -o "$EPOCH_LINE" from_xyz.log) <(grep -o "$EPOCH_LINE" from_dir.log); then
    echo "gpu_check: the directory's first epoch differs from the xyz file's" >&2
    exit 1
fi
echo "gpu_check: directory and xyz give the same first epoch on cuda"
# 6. throughput
python "$ROOT/benchmarks/gpu_throughput.py" ethanol_1000.xyz --batch-sizes 8 64 256
python "$ROOT/benchmarks/gpu_throughput.py" "$ROOT/examples/silicon/si_train.xyz" --batch-sizes 8 64
python "$ROOT/benchmarks/gpu_throughput.py" ethanol_1000.xyz --batch-sizes 64 --dtype float64
echo "gpu_check: all steps passed"
