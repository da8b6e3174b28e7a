"""The model on a GPU gives the CPU's results: energies, forces, stress (where the data
has it) and the parameter gradients of a force-training loss, in float64, on the first
structures of DATA. Part of scripts/gpu_check.sh.

    python scripts/gpu_matches_cpu.py DATA [--device cuda] [--structures 8] [--compiled]

``--compiled``: the device's predictions come from the compiled training step (on a GPU
its graphs of static shapes, replayed as CUDA graphs), the CPU's from the eager one.

(``--device cpu`` runs the same comparison against a second CPU copy: a check of the
script itself on a machine without a GPU.)
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

from atomtrain.data import FrameSet, collate, read_structures
from atomtrain.models import registry
from atomtrain.models.energy_model import EnergyModel
from atomtrain.options import LossOptions
from atomtrain.training.batches import global_counts
from atomtrain.training.compiled import CompiledPredictions
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import batch_loss

TOLERANCE = 1e-9  # relative to the largest value of each quantity
# the architectures' default sections, except where a smaller model checks the same path
SMALL_SECTIONS = {"mace": {"hidden_irreps": "16x0e + 16x1o", "max_ell": 2, "correlation": 2}}


def results_on(
    model: EnergyModel, structures, device: str, compiled: bool = False
) -> dict[str, torch.Tensor]:
    """Predictions and the loss's parameter gradients, computed on ``device`` (by the
    compiled training step when ``compiled``), on the CPU."""
    model = model.to(device)
    if device != "cpu":
        model.use_kernels_for(torch.device(device))  # MACE: cuequivariance when asked
    batch = collate(structures, model.cutoff).to(device, torch.float64)
    stress = batch.stress is not None
    if compiled:
        predictions = CompiledPredictions(model, True, stress, required=True)(batch)
    else:
        predictions = predict(model, batch, True, stress, create_graph=True)
    counts = global_counts(FrameSet.from_structures(structures), list(range(len(structures))))
    loss = batch_loss(predictions, batch, LossOptions(), counts)
    parameters = list(model.parameters())
    loss.backward(inputs=parameters)
    results = {name: value.detach().cpu() for name, value in predictions.items()}
    for name, parameter in model.named_parameters():
        results[f"gradient of {name}"] = parameter.grad.detach().cpu()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--structures", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--architecture", default="soap_bpnn", choices=registry.known())
    parser.add_argument(
        "--cueq",
        action="store_true",
        help="MACE on cuequivariance's kernels on the device (e3nn's on the CPU): its "
        "parameters are laid out otherwise, so predictions only are compared",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="the device's results from the compiled training step (the CPU's eager)",
    )
    arguments = parser.parse_args()
    structures = read_structures(arguments.data)[: arguments.structures]
    types = sorted({int(z) for structure in structures for z in structure.atomic_numbers})
    torch.manual_seed(0)
    section = {**SMALL_SECTIONS.get(arguments.architecture, {})}
    if arguments.architecture == "mace":  # cuequivariance only when asked
        section["cueq"] = arguments.cueq
    model = registry.new_model(arguments.architecture, types, **section)
    model.set_precision(torch.float64)
    reference = results_on(copy.deepcopy(model), structures, "cpu")
    other = results_on(copy.deepcopy(model), structures, arguments.device, arguments.compiled)
    worst = 0.0
    if arguments.cueq:
        reference = {name: value for name, value in reference.items() if name in other}
    for name, expected in reference.items():
        scale = float(expected.abs().max().clamp_min(1e-12))
        difference = float((other[name] - expected).abs().max()) / scale
        worst = max(worst, difference)
        if difference > arguments.tolerance:
            print(f"gpu_matches_cpu: {name} differs by {difference:.2e} (relative)")
    print(
        f"gpu_matches_cpu: {arguments.architecture}, {arguments.data}, "
        f"{len(structures)} structures, {'compiled ' if arguments.compiled else ''}"
        f"{arguments.device} against cpu: largest relative difference {worst:.2e} "
        f"over {len(reference)} quantities"
    )
    return 0 if worst <= arguments.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
