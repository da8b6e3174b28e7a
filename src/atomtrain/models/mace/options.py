"""The ``model`` section of MACE, with metatrain's (``experimental.mace``) names and
defaults. The validated section is the model's hyperparameter record. Nothing here
imports mace-torch, so that options files are checked without it."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from ...options_base import Strict, default_only

INTERACTIONS = Literal[
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticAttResidualInteractionBlock",
    "RealAgnosticInteractionBlock",
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
    "RealAgnosticResidualNonLinearInteractionBlock",
]
# e3nn's notation: a sum of {multiplicity}x{l}{parity} terms, e.g. "32x0e + 32x1o"
IRREPS = re.compile(r"^\s*\d+x\d+[eo](\s*\+\s*\d+x\d+[eo])*\s*$")


class ModelOptions(Strict):
    mace_model: str | None = None
    """A MACE model file to start from (``.model``, written by mace_run_train, e.g. a
    foundation model): training fine-tunes it, with its E0s, scale and shift, and the
    other keys of this section are read from it (set ones must agree). Relative paths
    are relative to the options file. The file is a pickled Python object: read only
    files you trust."""
    mace_head_name: str | None = None
    """metatrain's head of a multi-head MACE model file: multi-head models are not
    supported yet, accepted when unset."""
    mace_head_target: str = "energy"
    """metatrain's target of the MACE head; atomtrain learns energies only."""
    r_max: Annotated[float, Field(gt=0)] = 5.0
    """Cutoff radius (angstrom) of the neighbor search and of the radial basis."""
    num_radial_basis: Annotated[int, Field(ge=1)] = 8
    """Number of radial basis functions of the radial embedding."""
    radial_type: Literal["bessel", "gaussian", "chebyshev"] = "bessel"
    """Type of radial basis functions."""
    num_cutoff_basis: Annotated[int, Field(ge=1)] = 5
    """Order of the polynomial of the smooth cutoff."""
    max_ell: Annotated[int, Field(ge=0)] = 3
    """Highest l of the spherical harmonics of the edges."""
    interaction: INTERACTIONS = "RealAgnosticResidualInteractionBlock"
    """Interaction block of the layers after the first."""
    interaction_first: INTERACTIONS = "RealAgnosticResidualInteractionBlock"
    """Interaction block of the first layer."""
    num_interactions: Annotated[int, Field(ge=1)] = 2
    """Message passing steps."""
    hidden_irreps: str = "128x0e + 128x1o + 128x2e"
    """Irreps of the hidden node features (e3nn notation; one multiplicity for all)."""
    edge_irreps: str | None = None
    """Irreps of the edge features; unset: MACE's choice."""
    apply_cutoff: bool = True
    """Apply the cutoff to the radial basis before the radial MLP."""
    avg_num_neighbors: Annotated[float, Field(gt=0)] | None = None
    """Normalisation of the messages. Unset: the mean number of neighbors within r_max
    of the training set's atoms, as mace_run_train computes it (metatrain's default is
    1; set 1 to reproduce it)."""
    pair_repulsion: bool = False
    """Add MACE's ZBL pair repulsion."""
    distance_transform: Literal["Agnesi", "Soft"] | None = None
    """Transform of the distances before the radial basis."""
    correlation: Annotated[int, Field(ge=1)] = 3
    """Correlation order of the products of each layer (body order minus one)."""
    gate: Literal["silu", "tanh", "abs"] | None = "silu"
    """Non-linearity of the readout MLP."""
    MLP_irreps: str = "16x0e"
    """Hidden irreps of the last layer's readout MLP (scalars)."""
    radial_MLP: list[Annotated[int, Field(ge=1)]] = [64, 64, 64]
    """Widths of the radial MLP's hidden layers."""
    use_embedding_readout: bool = False
    """MACE's embedding readout."""
    use_last_readout_only: bool = False
    """Sum only the last layer's readout into the energy."""
    use_agnostic_product: bool = False
    """Element-agnostic products."""
    cueq: bool | None = None
    """NVIDIA's cuequivariance kernels for the tensor products (mace_run_train's
    --enable_cueq): unset, used when training on a CUDA device with cuequivariance-torch
    installed (pip install cuequivariance-torch cuequivariance-ops-torch-cu12); true,
    always (on a CPU through its slower PyTorch code, for checking); false, never. The
    same model either way: checkpoints and exports hold e3nn's layout of the weights."""

    _lacking = default_only(
        {
            "mace_head_name": "multi-head MACE models are not supported",
            "mace_head_target": "only the energy target is learned",
        }
    )

    @field_validator("hidden_irreps", "MLP_irreps", "edge_irreps")
    @classmethod
    def _irreps(cls, value: str | None) -> str | None:
        if value is not None and not IRREPS.match(value):
            raise ValueError(
                "irreps are written as e3nn writes them, a sum of {multiplicity}x{l}{parity} "
                "terms such as '32x0e + 32x1o'"
            )
        return value


# metatrain's experimental.mace defaults, which are mace_run_train's (but its
# gradient clipping at 10)
TRAINING_DEFAULTS = {
    "learning_rate": 0.01,
    "warmup_fraction": 0.0,
    "lr_scheduler": "ReduceLROnPlateau",
    "weight_decay": 5e-7,
    "amsgrad": True,
    "grad_clip_norm": 1.0,
    # mace_run_train's --ema_decay; measured on ethanol (docs/monitoring.md): held-out
    # force errors 7-11 % lower than without, where SOAP-BPNN's did not change
    "ema_decay": 0.99,
}

START_FILE_KEY = "mace_model"
"""The key of the model section that names a model file to start from."""
