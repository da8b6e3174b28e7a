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
from ..models.data_sizes import RecordedSizes
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
    most_pairs: int  # the most pairs one atom is the first of
    most_pairs_per_element: int  # ... with neighbors of one element

    def readable(self) -> str:
        atoms, structures, pairs = self.inputs[0][0], self.inputs[1][0], self.inputs[4][0]
        return f"{structures} structures, {atoms} atoms, {pairs} pairs"


def batch_shape(model: EnergyModel, batch: Batch) -> BatchShape:
    inputs = model_inputs(batch)
    n_types = len(model.atomic_types)
    element_index = model.type_to_index.index_select(0, batch.atomic_numbers)
    first, second = batch.pair_first, batch.pair_second
    n_atoms = int(batch.atomic_numbers.shape[0])
    per_atom = torch.bincount(first, minlength=n_atoms)
    per_element = torch.bincount(
        first * n_types + element_index.index_select(0, second), minlength=n_atoms * n_types
    )
    empty = first.numel() == 0
    return BatchShape(
        inputs=tuple(tuple(tensor.shape) for tensor in inputs.values()),
        mirrored_pairs=mirrored_half(first, second, batch.cell_shifts),
        element_atoms=tuple(torch.bincount(element_index, minlength=n_types).tolist()),
        most_pairs=0 if empty else int(per_atom.max()),
        most_pairs_per_element=0 if empty else int(per_element.max()),
    )


def known_sizes(shape: BatchShape) -> list[list[int]]:
    return [list(shape.element_atoms), [shape.most_pairs], [shape.most_pairs_per_element]]


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
            unknown = [value for value in recorded.values if value not in known_sizes(shape)]
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
        step = self.step_for(batch) if self.failed is None else None
        if step is None:
            return predict(self.model, batch, self.forces, self.stress, True)
        return step(batch)

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
