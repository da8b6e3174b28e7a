"""MACE's :class:`~atomtrain.models.architecture.Architecture`: how mace-torch's model
is built, read from a `.model` file, scripted, compiled and fine-tuned with adapters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ..architecture import Architecture, DataFacts
from . import ARCHITECTURE_NAME
from .options import ModelOptions

if TYPE_CHECKING:
    from .model import MaceModel


REFERENCES = {
    "implementation": [
        "atomtrain: https://github.com/atomtrain/atomtrain",
        "mace-torch: https://github.com/ACEsuit/mace",
    ],
    "architecture": [
        "MACE: I. Batatia, D. P. Kovács, G. N. C. Simm, C. Ortner, G. Csányi, Advances in "
        "Neural Information Processing Systems 35, 11423 (2022), "
        "https://arxiv.org/abs/2206.07697",
    ],
}


def build(options: ModelOptions, facts: DataFacts) -> MaceModel:
    from .model import MaceModel

    average = options.avg_num_neighbors or facts.average_neighbors
    assert average is not None, "the trainer computes average_neighbors when asked"
    return MaceModel(facts.atomic_types, options, average, facts.extra)


def read_file(path: str) -> MaceModel:
    from .model import read_mace_file

    return read_mace_file(path)


def script(model: torch.nn.Module) -> torch.jit.ScriptModule:
    """e3nn's compile: plain torch.jit.script fails on MACE's e3nn modules."""
    from .library import import_mace

    _, _, jit = import_mace()
    model.use_e3nn()  # export's own copy: cuequivariance's modules stay out of the file
    return jit.compile(model)


@contextlib.contextmanager
def python_modules() -> Iterator[None]:
    """Models built inside keep e3nn's generated code as Python modules, not
    TorchScript: make_fx traces through the latter wrongly (measured: the gradients of a
    force loss 1e-3 off those of the eager model and of finite differences)."""
    from .library import import_mace

    import_mace()
    import e3nn

    before = e3nn.get_optimization_defaults()["jit_script_fx"]
    e3nn.set_optimization_defaults(jit_script_fx=False)
    try:
        yield
    finally:
        e3nn.set_optimization_defaults(jit_script_fx=before)


def decays(name: str) -> bool:
    """mace-torch's choice (mace_run_train, metatrain): weight decay on the products and
    on the interactions' linear and skip weights; none on the embedding, the radial
    MLPs or the readouts."""
    if name.startswith("mace.products."):
        return True
    interaction = name.startswith("mace.interactions.")
    return interaction and ("linear.weight" in name or "skip_tp_full.weight" in name)


def inject_adapters(model: MaceModel, rank: int, alpha: float, targets: tuple[str, ...]) -> int:
    """mace-torch's own LoRA (mace_run_train's --lora): on every linear map of MACE,
    equivariant (e3nn's o3.Linear, with an equivariant bottleneck) or dense."""
    from mace.modules import lora

    if targets != ("*",):
        from ...errors import OptionsError

        raise OptionsError(
            "architecture.training.finetune.config.target_modules: MACE's adapters go on "
            "every linear map (mace-torch's LoRA); remove target_modules"
        )
    lora.inject_lora(model.mace, rank=rank, alpha=alpha)
    return sum(1 for name, _ in model.named_parameters() if "lora_A" in name)


def merge_adapters(model: MaceModel) -> None:
    from mace.modules import lora

    lora.merge_lora_weights(model.mace, inplace=True)


def check_section(options: ModelOptions) -> None:
    """``cueq: true`` that this installation or the model's correlation cannot honour,
    refused before the data is read (the kernels are chosen once the model meets its
    device, in the trainer)."""
    from . import cuequivariance

    cuequivariance.wanted(options.model_dump(), torch.device("cpu"))


def average_neighbors_within(options: ModelOptions) -> float | None:
    return options.r_max if options.avg_num_neighbors is None else None


ARCHITECTURE = Architecture(
    name=ARCHITECTURE_NAME,
    display_name="MACE",
    model_options=ModelOptions,
    build=build,
    references=REFERENCES,
    summary="mace-torch 0.3.16's `ScaleShiftMACE`, unchanged",
    install="`pip install atomtrain[mace]`",
    aliases=("experimental.mace",),
    script=script,
    average_neighbors_within=average_neighbors_within,
    decays=decays,
    check_section=check_section,
    scale_from_forces=True,
    learns_other_targets=True,
    read_file=read_file,
    head_modules=lambda section: ("readouts",),  # every interaction's readout
    module_prefix="mace.",
    python_modules=python_modules,
    # its compiled step took 0.70x the eager one's time, 8.6 ms less (ethanol, batch 8,
    # float32), and compiling takes 46-76 s (docs/performance-notes.md)
    compile_pays_after=8000,
    graph_holds_batch_sizes=True,  # its products hold the number of pairs
    inject_adapters=inject_adapters,
    merge_adapters=merge_adapters,
)
