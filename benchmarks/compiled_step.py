"""The compiled training step against the eager one, side by side (CPU).

    python benchmarks/compiled_step.py [--cases soap_ethanol,soap_silicon,mace_ethanol,pet_ethanol]
        [--batch 8] [--steps 20] [--rounds 5] [--threads 2] [--device cpu|cuda]
        [--static]

Each case builds its architecture as its example options file sets it (examples/...),
in float32, and times whole training steps (predictions with forces and, on silicon,
stress; the loss; its backward; a fused Adam step) on consecutive batches of the data
set, cycling through it. Eager and compiled steps alternate, ``--steps`` of each per
round, so that a change of the machine's load falls on both; the median step of each
is printed with their ratio, and the seconds the first compilation took (run it twice
to see the cache warm: TORCHINDUCTOR_CACHE_DIR, else ~/.cache/atomtrain/torchinductor).
``--static`` adds a third variant, graphs of static shapes per padded batch shape
compiled with CUDA graphs (mode reduce-overhead; what a run on a GPU compiles), and on
a GPU the compiled variant is the graph for every size: eager, dynamic and CUDA graphs
side by side. On a CPU inductor skips the CUDA graphs, and the third variant measures
padding and static shapes alone. One more case, not run unless named,
mace_defaults_ethanol: MACE with its section's defaults (metatrain's: 128x0e + 128x1o +
128x2e, max_ell 3). A benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml

from atomtrain.data import FrameSet, collate, read_structures
from atomtrain.models.registry import new_model
from atomtrain.options import LossOptions
from atomtrain.runtime import keep_freed_memory
from atomtrain.training.batches import global_counts
from atomtrain.training.compiled import CompiledPredictions
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import batch_loss

ROOT = Path(__file__).resolve().parent.parent
ETHANOL = ROOT / "examples/ethanol/ethanol_1000.xyz"
SILICON = ROOT / "examples/silicon/si_train.xyz"
CASES = {
    "soap_ethanol": ("soap_bpnn", ROOT / "examples/ethanol/options.yaml", ETHANOL),
    "soap_silicon": ("soap_bpnn", ROOT / "examples/silicon/options.yaml", SILICON),
    "mace_ethanol": ("mace", ROOT / "examples/mace/options.yaml", ETHANOL),
    # the MACE section's defaults, metatrain's (128x0e + 128x1o + 128x2e, max_ell 3)
    "mace_defaults_ethanol": ("mace", None, ETHANOL),
    "pet_ethanol": ("pet", ROOT / "examples/pet/options.yaml", ETHANOL),
}
# run only when named (minutes of compilation at this size)
NAMED_ONLY = {"mace_defaults_ethanol"}


def model_for(name: str, options_file: Path | None, types: list[int]):
    section = {}
    if options_file is not None:
        section = yaml.safe_load(options_file.read_text())["architecture"].get("model", {})
    return new_model(name, types, 8.0, **section).set_precision(torch.float32)


def run_case(
    case: str, batch_size: int, steps: int, rounds: int, device: str = "cpu", static: bool = False
) -> None:
    name, options_file, data = CASES[case]
    structures = read_structures(data)[: batch_size * steps]
    types = sorted({int(z) for structure in structures for z in structure.atomic_numbers})
    model = model_for(name, options_file, types).train().to(device)
    stress = all(structure.stress is not None for structure in structures)
    batches = []
    for first in range(0, len(structures) - batch_size + 1, batch_size):
        chosen = structures[first : first + batch_size]
        counts = global_counts(FrameSet.from_structures(chosen), list(range(len(chosen))))
        batches.append((collate(chosen, model.cutoff).to(device, torch.float32), counts))
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=1e-5, fused=True)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    compiled = CompiledPredictions(model, True, stress, required=False, static_shapes=False)
    variants = {"eager": lambda batch: predict(model, batch, True, stress, True)}
    variants["compiled"] = compiled
    if static:
        variants["static"] = CompiledPredictions(
            model, True, stress, required=False, static_shapes=True
        )

    def step(predictions, batch, counts):
        loss = batch_loss(predictions(batch), batch, LossOptions(), counts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=parameters)
        optimizer.step()

    first_step = {}
    for label, predictions in list(variants.items())[1:]:
        started = time.perf_counter()
        step(predictions, *batches[0])  # compiles, and runs the first backward
        first_step[label] = time.perf_counter() - started
        if predictions.failed is not None:
            print(f"{case}: {label} not compiled: {predictions.failed}", flush=True)
            del variants[label]
    if len(variants) == 1:
        return
    times: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, predictions in variants.items():
            for batch, counts in batches:
                start = time.perf_counter()
                step(predictions, batch, counts)
                synchronize()
                times[label].append(time.perf_counter() - start)
    eager_ms = 1000 * statistics.median(times["eager"])
    print(
        f"{case}: batch {batch_size}, float32, {device}; eager {eager_ms:.2f} ms per step "
        f"(median of {len(times['eager'])})",
        flush=True,
    )
    for label, predictions in list(variants.items())[1:]:
        milliseconds = 1000 * statistics.median(times[label])
        print(
            f"  {label} {milliseconds:.2f} ms, / eager {milliseconds / eager_ms:.3f}; "
            f"{predictions.compilations} compilations, {predictions.seconds:.1f} s (first "
            f"step, with tracing, the check against the eager step and the backward: "
            f"{first_step[label]:.1f} s); {predictions.eager_batches} batches eager",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    usual = ",".join(name for name in CASES if name not in NAMED_ONLY)
    parser.add_argument("--cases", default=usual)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--static", action="store_true", help="also static shapes with CUDA graphs")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    keep_freed_memory()  # as every atomtrain command does
    for case in arguments.cases.split(","):
        run_case(
            case,
            arguments.batch,
            arguments.steps,
            arguments.rounds,
            arguments.device,
            arguments.static,
        )


if __name__ == "__main__":
    main()
