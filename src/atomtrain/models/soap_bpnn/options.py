"""The ``model`` section of SOAP-BPNN, with metatrain's names and defaults. The validated
section is the model's hyperparameter record: checkpoints and exported models store it,
and the model is built from it alone (with the elements)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ...options_base import LongRangeOptions, Strict, default_only


class CutoffOptions(Strict):
    radius: Annotated[float, Field(gt=0)] = 5.0
    """Cutoff radius in angstrom; neighbors farther away are ignored."""
    width: Annotated[float, Field(gt=0)] = 0.5
    """Width (angstrom) of the smooth region before the radius where a neighbor's
    contribution goes smoothly to zero; at most the radius."""

    @model_validator(mode="after")
    def _width_within_radius(self) -> CutoffOptions:
        if self.width > self.radius:
            raise ValueError(
                f"width {self.width:g} is larger than radius {self.radius:g}: the smooth "
                "region would begin before the atom itself; give a width below the radius "
                "(default 0.5)"
            )
        return self


class SoapOptions(Strict):
    cutoff: CutoffOptions = CutoffOptions()
    """Where and how smoothly the atomic environment ends."""
    max_radial: Annotated[int, Field(ge=0)] = 7
    """Highest radial index. The radial basis is max_radial + 1 spherical Bessel functions
    j_0(n pi r / cutoff), the l = 0 Laplacian eigenstates of the cutoff sphere; higher l
    keep fewer of them, trimmed by Laplacian eigenvalue as metatrain's basis is (8, 7, 7,
    6, 6, 5, 5 for max_radial 7 and max_angular 6)."""
    max_angular: Annotated[int, Field(ge=0)] = 6
    """Highest angular momentum l of the spherical harmonics."""


class BpnnOptions(Strict):
    num_hidden_layers: Annotated[int, Field(ge=1)] = 2
    """Hidden layers in each element's network."""
    num_neurons_per_layer: Annotated[int, Field(ge=1)] = 32
    """Neurons in each hidden layer."""
    layernorm: bool = True
    """Normalise the SOAP features with a LayerNorm before the networks."""


class ModelOptions(Strict):
    soap: SoapOptions = SoapOptions()
    """SOAP power spectrum hyperparameters."""
    bpnn: BpnnOptions = BpnnOptions()
    """Per-element neural networks."""
    legacy: bool = True
    """metatrain's choice of one network per element (true: the SOAP-BPNN atomtrain
    implements) or a chemical embedding (false: not implemented)."""
    add_lambda_basis: bool = True
    """metatrain's; it changes tensorial targets only, so it has no effect on energies."""
    heads: dict[str, Literal["mlp", "linear"]] = {}
    """metatrain's head type per target: not implemented, accepted when empty."""
    zbl: bool = False
    """metatrain's ZBL short-range repulsion baseline: not implemented, accepted when
    false."""
    long_range: LongRangeOptions = LongRangeOptions()
    """metatrain's long-range part: not implemented, accepted when disabled."""

    _lacking = default_only(
        {
            "legacy": "only the legacy SOAP-BPNN is implemented",
            "heads": "per-target heads are not implemented",
            "zbl": "the ZBL baseline is not implemented",
        }
    )
