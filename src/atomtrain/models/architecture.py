"""What an architecture package gives the rest of atomtrain. The trainer, eval, export,
checkpoints and fine-tuning use an architecture only through this description, found by
name in :mod:`atomtrain.models.registry`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel

from ..targets import TargetSpec
from . import adapters
from .energy_model import EnergyModel


def nothing_to_do(*_: Any) -> None:
    return None


@dataclass
class DataFacts:
    """What a model is built from besides its section: facts of the training data."""

    atomic_types: list[int]
    """The elements (atomic numbers) the model is for."""
    average_neighbors: float | None = None
    """Mean number of neighbors per atom within the cutoff the architecture names
    (``average_neighbors_within``), when it names one."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Settings an architecture recorded beyond its section (the constructor settings
    of a model read from another program's file)."""


@dataclass(frozen=True)
class Architecture:
    name: str
    """``architecture.name`` in options files, checkpoints and exported models."""
    display_name: str
    """How logs and the exported model's metadata name it."""
    model_options: type[BaseModel]
    """Its ``architecture.model`` section; the validated section is the hyperparameter
    record that builds the model again."""
    build: Callable[[BaseModel, DataFacts], EnergyModel]
    """A new model from its section and the data's facts, with a zero baseline and unit
    scale (the trainer fits them). The model's ``hypers`` record both."""
    references: dict[str, list[str]]
    """The exported model's references (metatomic's 'architecture' list and others)."""
    summary: str = ""
    """What the model is, in a line (docs/architectures.md's table)."""
    install: str = "none"
    """What installs what it needs beyond atomtrain (docs/architectures.md's table)."""
    aliases: tuple[str, ...] = ()
    """Other names options files give it (metatrain's ``experimental.mace``); any
    ``experimental.`` prefix is read as none (registry.canonical_name)."""
    check_device: Callable[[torch.device], None] = nothing_to_do
    """Fails with one line when the model cannot run on a device (its kernels)."""
    check_section: Callable[[BaseModel], None] = nothing_to_do
    """Fails with one line when its section asks for what this installation lacks
    (MACE's ``cueq: true`` without cuequivariance): called before any data is read, and
    by ``train --check``."""
    extensions: tuple[str, ...] = ()
    """Names of the torch extension libraries its TorchScript code calls (e.g.
    'sphericart'): export collects these beside the model, and no other library the
    process happens to have loaded (torchvision, imported by a dependency, say)."""
    load_extensions: Callable[[], None] = nothing_to_do
    """Loads the torch extensions its TorchScript code calls, before export (so that
    metatomic collects them) and before loading an exported model."""
    script: Callable[[torch.nn.Module], torch.jit.ScriptModule] = torch.jit.script
    """How its model becomes TorchScript for export."""
    scale_from_forces: bool = False
    """The target scale (what the model's atomic outputs are multiplied by) is the RMS of
    the training forces' components, where forces are known (mace_run_train's default),
    instead of the per-atom spread of the energies about the baseline."""
    average_neighbors_within: Callable[[BaseModel], float | None] = nothing_to_do
    """The cutoff within which the model needs the training set's mean neighbor count
    (DataFacts.average_neighbors), or None when it needs none."""
    read_file: Callable[[str], EnergyModel] | None = None
    """Reads such a file (e.g. a ``.model`` written by mace_run_train) as a model whose
    ``hypers`` build it again."""
    read_metatrain: Callable[[dict[str, Any], str], EnergyModel] | None = None
    """Reads a metatrain checkpoint of the architecture (the dictionary
    models.metatrain_checkpoint loads, and its path for messages) as a model whose
    ``hypers`` build it again: fine-tuning and eval start from it."""
    head_modules: Callable[[BaseModel], tuple[str, ...]] | None = None
    """The modules fine-tuning's ``heads`` method trains by default (its last layers and
    readouts), as name patterns of the model's parameters (fnmatch; a module's name
    stands for every parameter under it); None: the method is not offered."""
    lora_targets: tuple[str, ...] = ("*",)
    """The linear maps fine-tuning's ``lora`` method adapts by default (patterns of their
    names, or of the last part of them: metatrain's ``input_linear``)."""
    inject_adapters: Callable[[EnergyModel, int, float, tuple[str, ...]], int] = (
        adapters.inject_linear
    )
    """Puts low-rank adapters (rank, alpha) on the chosen linear maps; how many."""
    merge_adapters: Callable[[EnergyModel], None] = adapters.merge_linear
    """Folds the adapters into the maps they adapt (for export)."""
    module_prefix: str = ""
    """Where the architecture's own network sits among the model's parameters ("pet."):
    module names given as metatrain names them, relative to the network, are found under
    it."""
    decays: Callable[[str], bool] = field(default=lambda name: True)
    """Whether weight decay applies to a parameter, by its name in the model (MACE's
    convention spares embeddings and readouts)."""
    upgrade_hypers: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda h: h)
    """The record of an older atomtrain version in today's form."""
    learns_other_targets: bool = False
    """Its models give per-atom features (``atomic_features``), on which heads for mtt::
    targets sit."""
    python_modules: Callable[[], AbstractContextManager] = contextlib.nullcontext
    """Models built inside are plain Python modules, none TorchScript, for make_fx to
    trace the compiled training step through (training/compiled.py)."""
    compile_pays_after: int | None = None
    """``compile: auto`` compiles the training step of runs of at least this many
    steps on CPU: where the time a compiled step saves (benchmarks/compiled_step.py,
    docs/performance.md) repays a cold compilation. None: no gain measured, never."""
    graph_holds_batch_sizes: bool = False
    """Its traced training step holds a size of its batch as a constant (MACE's e3nn
    code): the step is compiled per batch shape from the start, without the two
    symbolic traces that would show it (20 s of each compiled MACE run's start here)."""
    augments_rotations: bool = False
    """Its models are not rotationally invariant by construction (PET): the trainer
    gives each training structure a random rotation or improper rotation every epoch, as
    metatrain's trainer of such models does, and rotation tests measure how nearly
    invariant a trained model is instead of asserting exact invariance."""

    def options_from(self, hypers: dict[str, Any]) -> BaseModel:
        """The model section a hyperparameter record holds."""
        return self.model_options.model_validate(self.upgrade_hypers(hypers)["model"])

    def model_from(self, hypers: dict[str, Any]) -> EnergyModel:
        """A new model (untrained) with the hyperparameters of a record."""
        hypers = self.upgrade_hypers(hypers)
        facts = DataFacts(list(hypers["atomic_types"]), **hypers.get("facts", {}))
        model = self.build(self.options_from(hypers), facts)
        targets = hypers.get("targets")
        if targets is not None:
            specs = [TargetSpec.from_record(record) for record in targets["others"]]
            energies = targets.get("energies", ["energy"] if targets.get("energy") else [])
            model.attach_targets(specs, energies, targets.get("relative"))
        lora = hypers.get("adapters")
        if lora is not None:
            targets = tuple(lora["targets"])
            adapters.attach(model, self.inject_adapters, lora["rank"], lora["alpha"], targets)
        return model
