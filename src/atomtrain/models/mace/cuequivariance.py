"""MACE on NVIDIA's cuequivariance kernels: mace-torch's own conversion between its e3nn
layout of the weights and cuequivariance's, both ways.

The model trains in cuequivariance's layout; its ``state_dict`` stays in e3nn's, so that
checkpoints, exported models, eval and fine-tuning never depend on where it was trained.
Only the optimizer's state (one entry per parameter, in the training layout) does: a
checkpoint records the layout, and a resume in the other one is refused (Adam's moments
do not convert exactly through the reduced Clebsch-Gordan projection)."""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Iterator

import torch

from ...errors import AtomtrainError

LAYOUT = "cuequivariance"
CONVERTIBLE_CORRELATIONS = (2, 3)  # mace.cli.convert_e3nn_cueq.get_kmax_pairs
INSTALL = "pip install cuequivariance-torch cuequivariance-ops-torch-cu12"


def installed() -> bool:
    return importlib.util.find_spec("cuequivariance_torch") is not None


def description() -> str:
    """What the log says of the kernels."""
    if importlib.util.find_spec("cuequivariance_ops_torch") is None:
        return "cuequivariance kernels (its PyTorch code: cuequivariance-ops-torch is absent)"
    return "cuequivariance kernels"


def wanted(section: dict, device: torch.device) -> bool:
    """The model section's ``cueq`` on ``device``: unset means on CUDA when installed and
    mace-torch can convert the model (correlation 2 or 3)."""
    setting, correlation = section.get("cueq"), int(section["correlation"])
    convertible = correlation in CONVERTIBLE_CORRELATIONS
    if setting is None:
        return device.type == "cuda" and installed() and convertible
    if setting and not installed():
        raise AtomtrainError(
            f"architecture.model.cueq is true but cuequivariance-torch is not installed: "
            f"run '{INSTALL}', or set cueq: false"
        )
    if setting and not convertible:
        raise AtomtrainError(
            f"architecture.model.cueq is true, but mace-torch converts models of "
            f"correlation 2 or 3 to cuequivariance, not {correlation}; set cueq: false"
        )
    return setting


@contextlib.contextmanager
def default_dtype_kept() -> Iterator[None]:
    """mace-torch's converters set torch's default dtype to the model's."""
    previous = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def settings(e3nn_model: torch.nn.Module) -> dict:
    """What mace-torch's weight transfers need to know of the model, as its converters
    read it."""
    from mace.tools.scripts_utils import extract_config_mace_model

    config = extract_config_mace_model(e3nn_model)
    return {
        "num_product_irreps": len(config["hidden_irreps"].slices()) - 1,
        "correlation": config["correlation"],
        "num_layers": config["num_interactions"],
        "use_reduced_cg": config.get("use_reduced_cg", True),
        "keep_last_layer_irreps": config.get("keep_last_layer_irreps", False),
    }


def to_cuequivariance(e3nn_model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A new ScaleShiftMACE on cuequivariance's kernels with ``e3nn_model``'s weights."""
    from mace.cli.convert_e3nn_cueq import run

    with default_dtype_kept(), warnings.catch_warnings():
        # mace's constructor warns about its own tensor copies; cuequivariance, on each
        # module, that its CUDA kernels are absent (said once, in the log, instead)
        warnings.simplefilter("ignore", UserWarning)
        return run(e3nn_model, device="cuda" if device.type == "cuda" else "cpu")


def copy_weights(source: torch.nn.Module, target: torch.nn.Module, to_cueq: bool) -> None:
    """``source``'s weights into ``target`` of the other layout, in place (the
    parameters an optimizer holds stay the same tensors)."""
    if to_cueq:
        from mace.cli.convert_e3nn_cueq import transfer_weights

        e3nn_model = source
    else:
        from mace.cli.convert_cueq_e3nn import transfer_weights

        e3nn_model = target
    with torch.no_grad(), default_dtype_kept():
        transfer_weights(source, target, **settings(e3nn_model))
