"""The training step's predictions (energies, their forces and stress, every target)
as one compiled graph for batches of every size.

torch.compile cannot take the eager step: forces come from ``autograd.grad(...,
create_graph=True)`` and the loss's backward then differentiates them again, a double
backward that aot_autograd refuses. As NequIP does, the forward pass and its force and
stress derivatives are first traced into one plain graph of aten operations with
``make_fx``, symbolically (sizes are symbols, not numbers); torch.compile then compiles
that graph for dynamic sizes, and its backward for the loss is first order.

Sizes a model reads from its data (the most pairs of an atom, the atoms of each
element) enter the graph as the sizes of inputs added for them (models/data_sizes.py).
The graph is traced twice, for the batch and for the batch with its last structure
twice. Graphs that differ held a size as a constant (MACE's e3nn code does): the step
is then compiled per batch shape instead, batches padded to a few sizes
(training/padding.py), for at most MOST_SHAPES shapes.

On a GPU every architecture takes that second path with static shapes, and each
shape's graph is compiled as ``torch.compile(mode="reduce-overhead")`` compiles: its
forward and backward replayed as CUDA graphs, which take one shape each and launch a
step's hundreds of small kernels at once (STATIC_SHAPES_MODE).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..data.batch import Batch
from ..errors import AtomtrainError
from ..models import registry
from ..models.architecture import Architecture
from ..models.data_sizes import ProvidedSizes
from ..models.energy_model import EnergyModel, mirrored_half
from ..models.export import first_line
from ..runtime import user_cache
from .evaluation import model_inputs, predict
from .outputs import LOGGER_NAME
from .padding import BatchShape, BatchSizes, batch_shape, batch_sizes, padded
from .stopping import StopArrived, StopRequest

logger = logging.getLogger(LOGGER_NAME)

# at most this many batch shapes get a graph of their own (ShapedSteps)
MOST_SHAPES = 8
# how graphs of static shapes are compiled: torch.compile's mode for CUDA graphs
STATIC_SHAPES_MODE = "reduce-overhead"


class CompilationFailed(Exception):
    pass


class SizeHeldConstant(CompilationFailed):
    pass


def size_carriers(sizes: BatchSizes, device: torch.device) -> list[torch.Tensor]:
    """Empty tensors whose first sizes are what models read from a batch's data
    (data_sizes): a traced graph takes them as inputs, and their sizes as symbols."""
    numbers = [sizes.pairs, sizes.pairs_per_element, *sizes.elements]
    return [torch.empty((number, 0), device=device) for number in numbers]


def with_last_structure_twice(batch: Batch) -> Batch:
    """The model inputs of the batch with a copy of its last structure added: a second
    batch to trace, of other sizes (pairs kept in their mirrored layout)."""
    last = batch.n_structures - 1
    atoms = batch.system_index == last
    offset = int(atoms.sum())  # the last structure's atoms end the batch: so do the copy's
    half = batch.pair_first.shape[0] // 2
    halves = []
    for part in (slice(0, half), slice(half, None)):
        first, second = batch.pair_first[part], batch.pair_second[part]
        shifts = batch.cell_shifts[part]
        copied = batch.system_index.index_select(0, first) == last
        halves.append(
            (
                torch.cat([first, first[copied] + offset]),
                torch.cat([second, second[copied] + offset]),
                torch.cat([shifts, shifts[copied]]),
            )
        )
    variant = batch.energy_variant
    return dataclasses.replace(
        batch,
        positions=torch.cat([batch.positions, batch.positions[atoms]]),
        atomic_numbers=torch.cat([batch.atomic_numbers, batch.atomic_numbers[atoms]]),
        system_index=torch.cat([batch.system_index, batch.system_index[atoms] + 1]),
        cell=torch.cat([batch.cell, batch.cell[-1:]]),
        periodic=torch.cat([batch.periodic, batch.periodic[-1:]]),
        n_atoms=torch.cat([batch.n_atoms, batch.n_atoms[-1:]]),
        pair_first=torch.cat([halves[0][0], halves[1][0]]),
        pair_second=torch.cat([halves[0][1], halves[1][1]]),
        cell_shifts=torch.cat([halves[0][2], halves[1][2]]),
        energy_variant=None if variant is None else torch.cat([variant, variant[-1:]]),
    )


def traceable(sizes: BatchSizes, batch: Batch) -> bool:
    """A batch the graph for every size takes: pairs in the mirrored layout, and every
    size the graph holds as a symbol at least 2 (torch specializes sizes 0 and 1)."""
    half = mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts)
    numbers = [half, batch.n_structures, sizes.pairs, sizes.pairs_per_element, *sizes.elements]
    return min(numbers) >= 2


# reads of sizes, strides and detached views, which change nothing
READS = {
    torch.ops.aten.size.default,
    torch.ops.aten.stride.default,
    torch.ops.aten.sym_size.int,
    torch.ops.aten.sym_stride.int,
    torch.ops.aten.detach.default,
    operator.getitem,
}


def without_unused_reads(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The graph without the reads (READS) whose results nothing uses: traces of the
    same model differ in them. Only these: FX's dead code elimination would also judge
    in-place operations whose results are read through the tensor they write into."""
    removed = True
    while removed:
        removed = False
        for node in reversed(list(graph.graph.nodes)):
            if node.op == "call_function" and node.target in READS and not node.users:
                graph.graph.erase_node(node)
                removed = True
    graph.recompile()
    return graph


def without_numel(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``numel`` calls of the traced graph as products of sizes: torch.compile cannot
    take the former (sym_numel returns no tensor), and libraries call it."""
    for node in list(graph.graph.nodes):
        if node.target is not torch.ops.aten.sym_numel.default:
            continue
        source = node.args[0]
        with graph.graph.inserting_before(node):
            product: Any = 1
            for dimension in range(len(source.meta["val"].shape)):
                size = graph.graph.call_function(torch.ops.aten.sym_size.int, (source, dimension))
                product = (
                    size
                    if product == 1
                    else graph.graph.call_function(operator.mul, (product, size))
                )
        node.replace_all_uses_with(product)
        graph.graph.erase_node(node)
    graph.graph.lint()
    graph.recompile()
    return graph


@contextlib.contextmanager
def deterministic_lowering() -> Iterator[None]:
    """Inductor lowers sums into shared rows (index_add, the backward of a gather) to
    aten's kernels, not to atomic adds from several threads: those add in a varying
    order, and so would not give the same model twice (exact resume). Inductor takes
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


@contextlib.contextmanager
def without_duck_sizes() -> Iterator[None]:
    """Sizes that happen to be equal in the traced batch stay distinct symbols."""
    from torch.fx.experimental import _config

    before = _config.use_duck_shape
    _config.use_duck_shape = False
    try:
        yield
    finally:
        _config.use_duck_shape = before


def inductor_cache() -> Path:
    """Where inductor keeps what it compiled, so that the next run (or --restart)
    starts warm: TORCHINDUCTOR_CACHE_DIR when set, else the user's cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # inductor writes its default there when first asked (a library may have asked)
    if current is None or current == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(user_cache() / "torchinductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def described(error: BaseException) -> str:
    """The error's type and first line (dynamo's: those of the error it wraps)."""
    error = getattr(error, "inner_exception", None) or error
    name, line = type(error).__name__, first_line(error)[:300]
    return name if line == name else f"{name}: {line}"


def python_twin(model: EnergyModel) -> EnergyModel:
    """The model built again as plain Python modules (Architecture.python_modules), to
    be traced with the model's own parameters and buffers."""
    architecture = registry.architecture_of(model.hypers)
    if architecture.python_modules is contextlib.nullcontext:
        return model
    with architecture.python_modules():
        twin = architecture.model_from(model.hypers)
    dtype = next(model.parameters()).dtype
    twin = twin.set_precision(dtype)
    twin.heads_to(dtype)
    return twin.train(model.training).to(model.baseline.device)


def backward_decompositions() -> dict:
    """Decompositions of the backward operators the trace records (of layer norm,
    softmax, attention, ...) into operators with derivatives: autograd differentiates
    the traced graph once more for the loss, and an operator without a derivative there
    would add nothing, silently (measured on PET: the force loss's gradients wrong)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = core_aten_decompositions()
    # layer norm's forward too: its backward reads the mean and inverse deviation the
    # forward returns, outputs autograd takes as constants; a decomposed forward makes
    # them differentiable, else the loss's gradients miss their share (PET: 5e-3 off)
    table.update(get_decompositions([torch.ops.aten.native_layer_norm]))
    return table


class TracedStep:
    """The step's graph, traced with make_fx: parameters, buffers and the model's
    inputs in (and, traced symbolically, the size carriers), the predictions out."""

    def __init__(self, model: EnergyModel, batch: Batch, forces: bool, stress: bool):
        self.model = model
        self.state_names = [name for name, _ in model.named_parameters()]
        self.state_names += [name for name, _ in model.named_buffers()]
        self.input_names = list(model_inputs(batch))
        self.output_names: list[str] = []
        self.traced_model = python_twin(model)
        self.flags = {"compute_forces": forces, "compute_stress": stress, "create_graph": True}
        # libraries may take another path the first time (e3nn builds its code)
        self.traced_model(**model_inputs(batch), **self.flags)

    def step(self, *tensors: torch.Tensor, sizes: BatchSizes | None = None):
        """The predictions as a tuple; the sizes the model reads are ``sizes`` or, when
        None, those of the carriers after the inputs."""
        count, n_inputs = len(self.state_names), len(self.input_names)
        state = dict(zip(self.state_names, tensors[:count]))
        inputs = dict(zip(self.input_names, tensors[count : count + n_inputs]))
        if sizes is None:
            numbers = [carrier.shape[0] for carrier in tensors[count + n_inputs :]]
            sizes = BatchSizes(numbers[0], numbers[1], tuple(numbers[2:]))
        half = inputs["pair_first"].shape[0] // 2
        with ProvidedSizes(sizes.pairs, sizes.pairs_per_element, list(sizes.elements)):
            outputs = torch.func.functional_call(
                self.traced_model, state, (), {**inputs, **self.flags, "mirrored_pairs": half}
            )
        self.output_names = list(outputs)
        return tuple(outputs.values())

    def trace(self, arguments: list[torch.Tensor], mode: str, sizes=None) -> torch.fx.GraphModule:
        from torch.fx.experimental.proxy_tensor import make_fx

        def step(*tensors: torch.Tensor):
            return self.step(*tensors, sizes=sizes)

        try:
            with without_duck_sizes():
                graph = make_fx(
                    step,
                    decomposition_table=backward_decompositions(),
                    tracing_mode=mode,
                    _allow_non_fake_inputs=True,
                    _error_on_data_dependent_ops=True,
                )(*[tensor.clone() for tensor in arguments])
        except Exception as error:  # tracing's errors have no common base
            raise CompilationFailed(described(error)) from error
        return without_unused_reads(graph)

    def arguments(self, batch: Batch) -> list[torch.Tensor]:
        state = [parameter for _, parameter in self.model.named_parameters()]
        state += [buffer for _, buffer in self.model.named_buffers()]
        inputs = model_inputs(batch)
        return [*state, *(inputs[name] for name in self.input_names)]

    def outputs(self, values) -> dict[str, torch.Tensor]:
        return dict(zip(self.output_names, values))


class DynamicStep(TracedStep):
    """One graph for batches of every size: traced symbolically and compiled by
    torch.compile with dynamic sizes."""

    def __init__(self, model, batch, forces, stress, backend):
        super().__init__(model, batch, forces, stress)
        sizes = batch_sizes(model, batch)
        graph = self.trace(self.arguments(batch, sizes), "symbolic")
        larger = with_last_structure_twice(batch)
        larger_graph = self.trace(self.arguments(larger, batch_sizes(model, larger)), "symbolic")
        if larger_graph.code != graph.code:
            raise SizeHeldConstant("the model's graph holds a size of its batch as a constant")
        self.compiled = torch.compile(
            without_numel(graph), backend=backend, dynamic=True, fullgraph=True
        )

    def arguments(self, batch: Batch, sizes: BatchSizes | None = None) -> list[torch.Tensor]:
        sizes = sizes or batch_sizes(self.model, batch)
        return super().arguments(batch) + size_carriers(sizes, batch.positions.device)

    def __call__(self, batch: Batch, sizes: BatchSizes) -> dict[str, torch.Tensor]:
        with without_duck_sizes():  # dynamo's symbols too, when it (re)compiles
            return self.outputs(self.compiled(*self.arguments(batch, sizes)))


class ShapedSteps(TracedStep):
    """A graph per batch shape, for models whose graph holds a size as a constant and
    for CUDA graphs (``static``): batches padded to a few sizes (training/padding.py),
    each shape traced with its numbers and compiled by inductor, at most MOST_SHAPES of
    them. ``static``: compiled for exactly that shape (no symbols left)."""

    def __init__(self, model, batch, forces, stress, compiler, static: bool = False):
        super().__init__(model, batch, forces, stress)
        self.compiler = compiler
        self.static = static
        self.graphs: dict[BatchShape, Callable] = {}
        self.said_full = False

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor] | None:
        whole = padded(self.model, batch)
        shape = batch_shape(self.model, whole)
        graph = self.graphs.get(shape)
        if graph is None:
            if len(self.graphs) >= MOST_SHAPES:
                if not self.said_full:
                    logger.info(
                        f"the training step is compiled for {MOST_SHAPES} batch shapes, the "
                        f"most it compiles; batches of other shapes (here "
                        f"{shape.readable()}) run eagerly"
                    )
                    self.said_full = True
                return None
            arguments = self.arguments(whole)
            traced = self.trace(arguments, "symbolic", shape.sizes)
            graph = torch.compile(
                without_numel(traced),
                backend=self.compiler,
                dynamic=not self.static,
                fullgraph=True,
            )
            self.graphs[shape] = graph
        return self.cut(self.outputs(graph(*self.arguments(whole))), batch)

    def cut(self, outputs: dict[str, torch.Tensor], batch: Batch) -> dict[str, torch.Tensor]:
        """The outputs of a padded batch's own structures and atoms. Of static shapes,
        copies: a CUDA graph's next replay writes its outputs where the last left theirs,
        under anything (metrics, a caller) still holding them."""
        model = self.model
        per_atom = {"forces"} | {
            name for name, atoms in zip(model.target_names, model.per_atom_targets) if atoms
        }
        n_atoms, n_structures = int(batch.positions.shape[0]), batch.n_structures
        cut = {
            name: values[: n_atoms if name in per_atom else n_structures]
            for name, values in outputs.items()
        }
        return {name: values.clone() for name, values in cut.items()} if self.static else cut


class CompiledPredictions:
    """``predict(model, batch, forces, stress, create_graph=True)`` through a compiled
    graph: one for every batch size where the model allows it (DynamicStep), else one
    per batch shape (ShapedSteps); batches neither takes run eagerly. ``required``: a
    failed compilation is an error (compile: true), else the log says so in a line and
    the step goes on eagerly."""

    def __init__(
        self,
        model: EnergyModel,
        forces: bool,
        stress: bool,
        required: bool,
        compiler: Callable | None = None,
        static_shapes: bool | None = None,
    ):
        """``compiler``: what compiles a traced graph (graph, example inputs) instead of
        inductor (tests pass AOT autograd without code generation, in seconds).
        ``static_shapes``: graphs per padded batch shape, compiled for CUDA graphs
        (STATIC_SHAPES_MODE); None: on a GPU, not on a CPU (where inductor would skip
        the CUDA graphs, and the graph for every size is one compilation)."""
        self.model = model
        self.compiler = compiler
        self.static_shapes = static_shapes
        self.forces = forces
        self.stress = stress
        self.required = required
        self.dynamic: DynamicStep | None = None
        self.shaped: ShapedSteps | None = None
        self.failed: str | None = None
        self.compilations = 0
        self.seconds = 0.0
        self.eager_batches = 0
        self.verified = 0  # compilations whose graphs were checked against eager steps
        # the run's stop request: a stop signal gives up a compilation in progress
        self.stop: StopRequest | None = None
        inductor_cache()

    def __call__(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.failed is None and self.stop is not None and self.stop.requested:
            self.failed = "the run stops"  # compiling now would hold the stop back
        if self.failed is None:
            try:
                with self.stop.raised_here() if self.stop else contextlib.nullcontext():
                    found = self.compiled(batch)
                    if found is not None and self.compilations > self.verified:
                        self.verify(batch, found)
                        self.verified = self.compilations
                        # the step's loss needs outputs of its own: a compiled backward
                        # runs once (its buffers are donated), and a CUDA graph's
                        # forward is followed by its backward before it runs again
                        found = self.compiled(batch)
                if found is not None:
                    return found
            except StopArrived as arrived:
                # a compilation takes up to a minute (MACE), a scheduler waits 30-120 s
                # after its signal before it kills: this step goes on eagerly, and the
                # run stops after it (a resumed run compiles again)
                self.failed = "the run stops"
                # the signal may also land in a compiled step that only runs (dynamo's
                # recompilations cannot be told apart beforehand): the line says both
                logger.info(
                    f"{arrived.args[0]} arrived during the compiled training step or its "
                    "compilation, which was given up: the step runs eagerly and the run "
                    "stops after it"
                )
            except CompilationFailed as error:
                self.fail(str(error), error)
            except Exception as error:
                if not type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
                    raise
                self.fail(described(error), error)
        self.eager_batches += 1
        return predict(self.model, batch, self.forces, self.stress, True)

    def compiled(self, batch: Batch) -> dict[str, torch.Tensor] | None:
        if self.static_shapes is None:
            self.static_shapes = batch.positions.device.type == "cuda"
        if self.shaped is None and self.static_shapes:
            logger.info(
                "the training step is compiled per batch shape, each for CUDA graphs "
                f"(mode {STATIC_SHAPES_MODE}; batches padded to a few sizes)"
            )
            self.shaped = ShapedSteps(
                self.model, batch, self.forces, self.stress, self.compile_shape, static=True
            )
        if self.shaped is not None:
            return self.shaped(batch)
        sizes = batch_sizes(self.model, batch)
        if not traceable(sizes, batch):
            return None
        if self.dynamic is None:
            started = time.perf_counter()
            try:
                if registry.architecture_of(self.model.hypers).graph_holds_batch_sizes:
                    raise SizeHeldConstant("the architecture's graph holds a size of its batch")
                self.dynamic = DynamicStep(
                    self.model, batch, self.forces, self.stress, self.backend
                )
            except SizeHeldConstant as error:
                logger.info(f"the training step is compiled per batch shape: {error}")
                self.shaped = ShapedSteps(
                    self.model, batch, self.forces, self.stress, self.compile_shape
                )
                return self.shaped(batch)
            finally:
                self.seconds += time.perf_counter() - started
        return self.dynamic(batch, sizes)

    def verify(self, batch: Batch, found: dict[str, torch.Tensor] | None) -> None:
        """The predictions of a newly compiled graph, and the gradients of a loss on them,
        against the eager step's on the same batch: a compiler's or a library's fault
        shows here, not as a model that silently trains worse (before the backward
        decompositions, the force loss's gradients were 1e-2 off for MACE and 1.8
        for PET; with them, PET's were still 5e-3 off in float64, until layer norm's
        forward was decomposed too)."""
        assert found is not None
        expected = predict(self.model, batch, self.forces, self.stress, True)
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        names = sorted(expected)
        worst, where = 0.0, ""
        gradients = []
        for predictions in (expected, found):
            loss = sum(
                (1.0 + index) * (predictions[name].to(torch.float64) ** 2).sum()
                for index, name in enumerate(names)
            )
            gradients.append(torch.autograd.grad(loss, parameters, allow_unused=True))
        pairs = [(name, expected[name], found[name]) for name in names]
        pairs += [
            (f"the gradient of {name}", eager, compiled)
            for (name, _), eager, compiled in zip(
                [(n, p) for n, p in self.model.named_parameters() if p.requires_grad],
                *gradients,
            )
            if eager is not None and compiled is not None
        ]
        for name, eager, compiled in pairs:
            scale = float(eager.detach().abs().max()) if eager.numel() else 0.0
            error = float((compiled.detach() - eager.detach()).abs().max()) if eager.numel() else 0
            relative = error / scale if scale > 0 else error
            if relative > worst:
                worst, where = relative, name
        tolerance = 1e-8 if batch.positions.dtype == torch.float64 else 1e-3
        if worst > tolerance:
            raise CompilationFailed(
                f"the compiled step disagrees with the eager one on its first batch ({where}: "
                f"{worst:.1e} relative, more than {tolerance:g}), a fault of the compiler or "
                "of an operator's derivative"
            )

    def fail(self, reason: str, error: BaseException) -> None:
        self.failed = reason
        if self.required:
            raise AtomtrainError(
                f"the training step could not be compiled ({reason}); set "
                "architecture.training.compile: false to train eagerly"
            ) from error
        logger.info(f"the training step could not be compiled, so it runs eagerly: {reason}")

    def backend(self, graph: torch.fx.GraphModule, example_inputs: list[Any]):
        """Inductor, counted and timed: torch.compile calls it for the first batch and
        again whenever a batch breaks what the graph assumed (a recompilation)."""
        return self.inductor(graph, example_inputs, "for batches of any size")

    def compile_shape(self, graph: torch.fx.GraphModule, example_inputs: list[Any]):
        shape = (
            "a batch shape" if self.shaped is None else f"batch shape {len(self.shaped.graphs) + 1}"
        )
        return self.inductor(graph, example_inputs, f"for {shape}")

    def inductor(self, graph: torch.fx.GraphModule, example_inputs: list[Any], what: str):
        from torch._inductor import config, list_mode_options
        from torch._inductor.compile_fx import compile_fx

        mode = list_mode_options(STATIC_SHAPES_MODE) if self.static_shapes else {}
        started = time.perf_counter()
        with deterministic_lowering(), config.patch(mode):
            compiled = (self.compiler or compile_fx)(graph, example_inputs)
        seconds = time.perf_counter() - started
        self.compilations += 1
        self.seconds += seconds
        logger.info(
            f"compiled the training step {what} in {seconds:.1f} s (compilation "
            f"{self.compilations}; cache in {inductor_cache()})"
        )
        return compiled


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
