"""The ``model`` section of PET, with metatrain's (``pet``) names and defaults: a
metatrain PET options file trains unchanged where the meanings agree. The validated
section is the model's hyperparameter record. Nothing here imports metatrain, so that
options files are checked without it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ...options_base import LongRangeOptions, Strict, default_only


class ModelOptions(Strict):
    cutoff: Annotated[float, Field(gt=0)] = 4.5
    """Cutoff radius (angstrom) of the neighbor search: interactions beyond it are
    neglected. A lower cutoff gives a faster model."""
    num_neighbors_adaptive: Annotated[int, Field(ge=1)] | None = None
    """metatrain's adaptive cutoff (a per-atom cutoff that keeps about this many
    neighbors): not implemented, accepted when unset."""
    adaptive_cutoff_method: Literal["grid", "solver"] = "solver"
    """metatrain's; unused while num_neighbors_adaptive is unset."""
    cutoff_function: Literal["Cosine", "Bump"] = "Bump"
    """Shape of the smooth switching of a neighbor's weight to zero at the cutoff."""
    cutoff_width: Annotated[float, Field(gt=0)] = 0.5
    """Width (angstrom) of that switching region, ending at the cutoff."""
    cutoff_width_adaptive: Annotated[float, Field(gt=0)] = 1.0
    """metatrain's; unused while num_neighbors_adaptive is unset."""
    d_pet: Annotated[int, Field(ge=1)] = 128
    """Width of the edge features: the network's width. Larger may be more accurate on
    large data sets, and is slower."""
    d_head: Annotated[int, Field(ge=1)] = 128
    """Width of the output heads' hidden layers."""
    d_node: Annotated[int, Field(ge=1)] = 256
    """Width of the node features."""
    d_feedforward: Annotated[int, Field(ge=1)] = 256
    """Width of the feed-forward network in each attention layer."""
    num_heads: Annotated[int, Field(ge=1)] = 8
    """Attention heads per attention layer (d_pet must be a multiple of it)."""
    num_attention_layers: Annotated[int, Field(ge=1)] = 2
    """Attention layers in each message-passing layer."""
    num_gnn_layers: Annotated[int, Field(ge=1)] = 2
    """Message-passing layers; 1 gives a much faster and less accurate model."""
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    """Normalisation layers of the transformer."""
    activation: Literal["SiLU", "SwiGLU"] = "SwiGLU"
    """Activation of the feed-forward networks."""
    attention_temperature: Annotated[float, Field(gt=0)] = 1.0
    """Temperature of the attention scores."""
    transformer_type: Literal["PreLN", "PostLN"] = "PreLN"
    """Normalisation before (PreLN) or after (PostLN) attention."""
    featurizer_type: Literal["residual", "feedforward"] = "feedforward"
    """"feedforward": the last layer's features are read out, and messages in both
    directions are mixed between layers; "residual": every layer's features are read
    out (the original PET)."""
    zbl: bool = False
    """metatrain's ZBL short-range repulsion: not implemented, accepted when false."""
    long_range: LongRangeOptions = LongRangeOptions()
    """metatrain's long-range part: not implemented, accepted when disabled."""
    system_conditioning: bool = False
    """metatrain's charge and spin embeddings: not implemented, accepted when false."""
    max_charge: Annotated[int, Field(ge=0)] = 10
    """metatrain's; unused while system_conditioning is false."""
    max_spin_multiplicity: Annotated[int, Field(ge=1)] = 10
    """metatrain's; unused while system_conditioning is false."""

    _lacking = default_only(
        {
            "num_neighbors_adaptive": "the adaptive cutoff is not implemented",
            "zbl": "the ZBL baseline is not implemented",
            "system_conditioning": "charge and spin conditioning is not implemented",
        }
    )

    @model_validator(mode="after")
    def _widths(self) -> ModelOptions:
        if self.cutoff_width > self.cutoff:
            raise ValueError(
                f"cutoff_width {self.cutoff_width:g} is larger than cutoff {self.cutoff:g}; "
                "give a width below the cutoff (default 0.5)"
            )
        if self.d_pet % self.num_heads:
            raise ValueError(
                f"d_pet {self.d_pet} is not a multiple of num_heads {self.num_heads}: the "
                "attention splits the edge features among its heads"
            )
        return self

    def backend_hypers(self) -> dict[str, Any]:
        """The section as metatrain's PETBackend reads its hypers."""
        return self.model_dump(mode="python")


# metatrain's pet defaults; its weight_decay is AdamW's
TRAINING_DEFAULTS = {
    "optimizer": "adamw",
    "learning_rate": 1e-4,
    "batch_size": 16,
    "grad_clip_norm": 1.0,
}
