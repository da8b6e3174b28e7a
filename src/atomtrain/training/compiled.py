"""The training step's predictions (energies, their forces and stress, every target)
as one compiled graph per batch shape.

torch.compile cannot take the eager step: forces come from ``autograd.grad(...,
create_graph=True)`` and the loss's backward then differentiates them again, a double
backward that aot_autograd refuses. As NequIP does, the forward pass and its force and
stress derivatives are first traced into one plain graph of aten operations with
``make_fx``; inductor compiles that graph, whose backward for the loss is first order.

A traced graph holds the batch's sizes as constants: the shapes of its inputs and the
sizes a model reads from its data (models/data_sizes.py). ``BatchShape`` is all of
them, and each graph serves the batches of one shape; a data set of molecules of one
kind has one. The number of shapes compiled is bounded; batches of further shapes run
eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.batch import Batch
from ..errors import AtomtrainError
from ..models.architecture import Architecture
from ..models.data_sizes import RecordedSizes, bucket
from ..models.energy_model import EnergyModel, mirrored_half
from .evaluation import model_inputs, predict
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

# at most this many batch shapes get a graph of their own (each costs a compilation)
MOST_SHAPES = 8


@dataclass(frozen=True)
class BatchShape:
    """Everything a traced step's graph holds as a constant about its batch."""

    inputs: tuple[tuple[int, ...], ...]  # the shape of each model input, in order
    mirrored_pairs: int  # EnergyModel.edge_geometry's half; 0 for another layout
    element_atoms: tuple[int, ...]  # atoms of each of the model's elements
    most_pairs: int  # the most pairs one atom is the first of, rounded up (bucket)
    most_pairs_per_element: int  # ... with neighbors of one element, rounded up

    def readable(self) -> str:
        atoms, structures, pairs = self.inputs[0][0], self.inputs[1][0], self.inputs[4][0]
        return f"{structures} structures, {atoms} atoms, {pairs} pairs"

    def known_sizes(self) -> list[list[int]]:
        """What models may read from the data of a batch of this shape (data_sizes)."""
        widths = [[self.most_pairs], [self.most_pairs_per_element]]
        return [list(self.element_atoms), *widths]


def pair_counts(model: EnergyModel, batch: Batch) -> tuple[int, int]:
    """(the most pairs one atom is the first of, ... with neighbors of one element)."""
    first, second = batch.pair_first, batch.pair_second
    if first.numel() == 0:
        return 0, 0
    n_types, n_atoms = len(model.atomic_types), int(batch.atomic_numbers.shape[0])
    element_index = model.type_to_index.index_select(0, batch.atomic_numbers)
    per_atom = torch.bincount(first, minlength=n_atoms)
    per_element = torch.bincount(first * n_types + element_index.index_select(0, second))
    return int(per_atom.max()), int(per_element.max())


def batch_shape(model: EnergyModel, batch: Batch) -> BatchShape:
    element_index = model.type_to_index.index_select(0, batch.atomic_numbers)
    most, most_per_element = pair_counts(model, batch)
    n_types = len(model.atomic_types)
    return BatchShape(
        inputs=tuple(tuple(tensor.shape) for tensor in model_inputs(batch).values()),
        mirrored_pairs=mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts),
        element_atoms=tuple(torch.bincount(element_index, minlength=n_types).tolist()),
        most_pairs=bucket(most),
        most_pairs_per_element=bucket(most_per_element),
    )


def padded(model: EnergyModel, batch: Batch) -> Batch:
    """The batch with atoms, pairs and structures added up to the next sizes of
    ``bucket``, so that batches of nearby sizes share one graph. What is added changes
    no prediction of the batch's own structures: the atoms added belong to structures
    of their own (after the batch's, without a cell), the pairs added join added atoms
    only, and the added atoms come after the batch's, so no index of the batch changes.
    Their outputs are cut off again (CompiledPredictions). Pairs are kept in the
    mirrored layout [pairs; the same reversed]; a batch in another layout is returned
    unchanged (its shape then is its own)."""
    n_pairs = int(batch.pair_first.shape[0])
    half = mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts)
    if n_pairs and not half:
        return batch
    added_pairs = bucket(half) - half
    most = pair_counts(model, batch)[1]
    # the added atoms that hold the added pairs: as many as keep each one's pairs near
    # the batch's most per atom and element, so that the widths do not grow
    hosts = 0 if added_pairs == 0 else max(2, -(-2 * added_pairs // max(most, 1)))
    n_types = len(model.atomic_types)
    element_index = model.type_to_index.index_select(0, batch.atomic_numbers)
    counts = torch.bincount(element_index, minlength=n_types).tolist()
    counts[0] += hosts  # hosts are of the model's first element
    added_elements: list[int] = [0] * hosts
    for element, count in enumerate(counts):
        added_elements += [element] * (bucket(count) - count)
    n_added = len(added_elements)
    n_structures = batch.n_structures
    total_structures = bucket(n_structures + (1 if n_added else 0))
    if n_added == 0 and total_structures == n_structures:
        return batch
    n_atoms = int(batch.positions.shape[0])
    like = batch.positions
    types = torch.tensor(model.atomic_types, dtype=batch.atomic_numbers.dtype)
    atomic_numbers = types.index_select(0, torch.tensor(added_elements, dtype=torch.long))
    # on a circle well within the cutoff: every added pair has a length, and a small one
    angles = torch.arange(n_added, dtype=torch.float64) * (2 * torch.pi / max(n_added, 1))
    radius = 0.3 * model.cutoff
    circle = torch.stack([radius * angles.cos(), radius * angles.sin(), 0 * angles], 1)
    # added pair k joins host k mod hosts to the next host
    chain = torch.arange(added_pairs, dtype=torch.long)
    index = batch.pair_first
    first = (n_atoms + chain % max(hosts, 1)).to(index.device)
    second = (n_atoms + (chain + 1) % max(hosts, 1)).to(index.device)
    shifts = batch.cell_shifts
    no_shift = shifts.new_zeros((added_pairs, 3))
    real_first, real_second = index[:half], batch.pair_second[:half]
    extra_structures = total_structures - n_structures
    added_counts = [n_added] + [0] * (extra_structures - 1)
    variant = batch.energy_variant
    return dataclasses.replace(
        batch,
        positions=torch.cat([batch.positions, circle.to(like)]),
        atomic_numbers=torch.cat([batch.atomic_numbers, atomic_numbers.to(index.device)]),
        system_index=torch.cat(
            [batch.system_index, batch.system_index.new_full((n_added,), n_structures)]
        ),
        cell=torch.cat([batch.cell, batch.cell.new_zeros((extra_structures, 3, 3))]),
        periodic=torch.cat([batch.periodic, batch.periodic.new_zeros(extra_structures)]),
        pair_first=torch.cat([real_first, first, real_second, second]),
        pair_second=torch.cat([real_second, second, real_first, first]),
        cell_shifts=torch.cat([shifts[:half], no_shift, shifts[half:], no_shift]),
        n_atoms=torch.cat([batch.n_atoms, batch.n_atoms.new_tensor(added_counts)]),
        energy_variant=None
        if variant is None
        else torch.cat([variant, variant.new_zeros(extra_structures)]),
    )


class CompilationFailed(Exception):
    pass


class TracedStep:
    """One batch shape's compiled graph: parameters, buffers and the model's inputs in,
    the predictions out."""

    def __init__(self, model: EnergyModel, batch: Batch, shape: BatchShape, forces, stress):
        self.model = model
        self.state_names = [name for name, _ in model.named_parameters()] + [
            name for name, _ in model.named_buffers()
        ]
        self.input_names = list(model_inputs(batch))
        self.output_names: list[str] = []
        flags = {
            "compute_forces": forces,
            "compute_stress": stress,
            "create_graph": True,
            "mirrored_pairs": shape.mirrored_pairs,
        }

        def step(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            count = len(self.state_names)
            state = dict(zip(self.state_names, tensors[:count]))
            inputs = dict(zip(self.input_names, tensors[count:]))
            outputs = torch.func.functional_call(model, state, (), {**inputs, **flags})
            self.output_names = list(outputs)
            return tuple(outputs.values())

        from torch._inductor.compile_fx import compile_fx
        from torch.fx.experimental.proxy_tensor import make_fx

        arguments = self.arguments(batch)
        try:
            with RecordedSizes() as recorded:
                graph = make_fx(step, tracing_mode="real")(*arguments)
            unknown = [value for value in recorded.values if value not in shape.known_sizes()]
            if unknown:
                raise CompilationFailed(
                    f"the model reads sizes from its data that atomtrain cannot key graphs "
                    f"by ({unknown})"
                )
            with deterministic_lowering():
                self.compiled = compile_fx(graph, list(arguments))
        except CompilationFailed:
            raise
        except Exception as error:  # inductor's own errors have no common base
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise CompilationFailed(f"{type(error).__name__}: {first_line[:300]}") from error

    def arguments(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        state = [parameter for _, parameter in self.model.named_parameters()]
        state += [buffer for _, buffer in self.model.named_buffers()]
        inputs = model_inputs(batch)
        return (*state, *(inputs[name] for name in self.input_names))

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        outputs = self.compiled(*self.arguments(batch))
        return dict(zip(self.output_names, outputs))


@contextlib.contextmanager
def deterministic_lowering() -> Iterator[None]:
    """Inductor lowers sums into shared rows (index_add, the backward of a gather) to
    aten's kernels, not to atomic adds from several threads: those add in a varying
    order, and so would not give the same model twice (exact resume), and took 4x as
    long as aten's on SOAP-BPNN's step (benchmarks/compiled_step.py). Inductor takes
    torch's deterministic mode for that wish, at lowering only; the backward is lowered
    now too, not at its first call, so that the mode covers it."""
    from torch._functorch import config as functorch_config

    was_on = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with functorch_config.patch(force_non_lazy_backward_lowering=True):
            yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=warn_only)


def inductor_cache() -> Path:
    """Where inductor keeps what it compiled, so that the next run (or --restart)
    starts warm: TORCHINDUCTOR_CACHE_DIR when set, else the user's cache."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base / "atomtrain" / "torchinductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


class CompiledPredictions:
    """``predict(model, batch, forces, stress, create_graph=True)`` through a compiled
    graph per batch shape. ``required``: a failed compilation is an error (compile:
    true), else the step says so once and goes on eagerly."""

    def __init__(self, model: EnergyModel, forces: bool, stress: bool, required: bool):
        self.model = model
        self.forces = forces
        self.stress = stress
        self.required = required
        self.steps: dict[BatchShape, TracedStep] = {}
        self.failed: str | None = None
        self.said_full = False
        self.compilations = 0
        self.seconds = 0.0
        inductor_cache()

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.failed is None:
            whole = padded(self.model, batch)
            step = self.step_for(whole)
            if step is not None:
                return self.cut(step(whole), batch)
        return predict(self.model, batch, self.forces, self.stress, True)

    def cut(self, outputs: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
        """The outputs of a padded batch's own structures and atoms."""
        per_atom = {"forces"} | {
            name
            for name, atoms in zip(self.model.target_names, self.model.per_atom_targets)
            if atoms
        }
        n_atoms, n_structures = int(batch.positions.shape[0]), batch.n_structures
        return {
            name: values[: n_atoms if name in per_atom else n_structures]
            for name, values in outputs.items()
        }

    def step_for(self, batch: Batch) -> TracedStep | None:
        shape = batch_shape(self.model, batch)
        step = self.steps.get(shape)
        if step is not None:
            return step
        if len(self.steps) >= MOST_SHAPES:
            if not self.said_full:
                logger.info(
                    f"the training step is compiled for {MOST_SHAPES} batch shapes, the "
                    f"most it compiles; batches of other shapes (here {shape.readable()}) "
                    "run eagerly"
                )
                self.said_full = True
            return None
        started = time.perf_counter()
        try:
            step = TracedStep(self.model, batch, shape, self.forces, self.stress)
        except CompilationFailed as error:
            self.failed = str(error)
            if self.required:
                raise AtomtrainError(
                    f"the training step could not be compiled ({error}); set "
                    "architecture.training.compile: false to train eagerly"
                ) from error
            logger.info(f"the training step could not be compiled, so it runs eagerly: {error}")
            return None
        seconds = time.perf_counter() - started
        self.steps[shape] = step
        self.compilations += 1
        self.seconds += seconds
        logger.info(
            f"compiled the training step for batches of {shape.readable()} in "
            f"{seconds:.1f} s ({len(self.steps)} batch shape"
            f"{'s' if len(self.steps) > 1 else ''} so far, at most {MOST_SHAPES})"
        )
        return step


def compile_decision(
    option: bool | str, architecture: Architecture, device: torch.device, steps: int
) -> tuple[bool, str]:
    """(compile the training step, why) for ``compile: option`` on a run of ``steps``
    training steps."""
    if option is not True and option is not False:  # auto
        after = architecture.compile_pays_after
        if device.type != "cpu":
            return False, f"compile: auto; not yet measured on {device.type}"
        if after is None:
            return False, f"compile: auto; no gain measured for {architecture.display_name}"
        if steps < after:
            return False, (
                f"compile: auto; a run of {steps} steps is shorter than the {after} that "
                f"repay compiling {architecture.display_name}"
            )
        return True, f"compile: auto; a run of {steps} steps repays it"
    return bool(option), f"compile: {str(option).lower()}"


def step_predictions(
    model: EnergyModel,
    forces: bool,
    stress: bool,
    option: bool | str,
    architecture: Architecture,
    device: torch.device,
    steps: int,
) -> Callable[[Batch], dict[str, torch.Tensor]]:
    """The training step's predictions: compiled, or eager (the log says which)."""
    compiled, why = compile_decision(option, architecture, device, steps)
    logger.debug(f"the training step is {'compiled' if compiled else 'eager'} ({why})")
    if not compiled:
        return lambda batch: predict(model, batch, forces, stress, True)
    return CompiledPredictions(model, forces, stress, required=option is True)
