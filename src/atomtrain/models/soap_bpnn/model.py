"""SOAP-BPNN: SOAP power spectrum features and one neural network per element."""

from __future__ import annotations

import torch

from ..energy_model import EnergyModel
from . import ARCHITECTURE_NAME
from .bpnn import ElementNetworks, LayerNorm
from .options import ModelOptions
from .soap import SoapPowerSpectrum


class SoapBpnn(EnergyModel):
    """Atomic energy NN_{Z_i}(LayerNorm(SOAP_i))."""

    def __init__(self, atomic_types: list[int], options: ModelOptions | None = None):
        options = options or ModelOptions()
        hypers = {
            "architecture": ARCHITECTURE_NAME,
            "atomic_types": list(atomic_types),
            "model": options.model_dump(mode="json"),
        }
        soap, bpnn = options.soap, options.bpnn
        super().__init__(hypers, soap.cutoff.radius)
        n_types = len(self.atomic_types)
        self.soap = SoapPowerSpectrum(
            n_types, soap.cutoff.radius, soap.cutoff.width, soap.max_radial, soap.max_angular
        )
        n_features = self.soap.n_features
        self.layernorm = LayerNorm(n_features) if bpnn.layernorm else torch.nn.Identity()
        self.networks = ElementNetworks(
            n_types, n_features, bpnn.num_hidden_layers, bpnn.num_neurons_per_layer
        )

    def set_precision(self, dtype: torch.dtype) -> SoapBpnn:
        """Features and networks in ``dtype``; the energy baseline and the sum of atomic
        energies stay in float64, since total energies can be large (-20000 eV)."""
        self.soap.to(dtype)
        self.layernorm.to(dtype)
        self.networks.to(dtype)
        self.heads_to(dtype)
        return self

    @torch.jit.unused
    def feature_width(self) -> int:
        return self.soap.n_features

    @torch.jit.unused
    def details(self) -> list[str]:
        return [f"{self.soap.n_features} features"]

    def atomic_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        """LayerNorm(SOAP) of each atom: what the energy networks and the heads take."""
        features = self.soap(
            edge_vectors.to(self.soap.wavenumbers.dtype),  # the features' dtype
            pair_first,
            element_index.index_select(0, pair_second),
            element_index.shape[0],
            mirrored,
        )
        return self.layernorm(features)

    def energy_from_features(
        self, features: torch.Tensor, element_index: torch.Tensor
    ) -> torch.Tensor:
        return self.networks(features, element_index)

    def atomic_outputs(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        features = self.atomic_features(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        return self.energy_from_features(features, element_index)

    def atomic_last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.atomic_features(
            edge_vectors, pair_first, pair_second, element_index, mirrored
        )
        energies = self.networks(features, element_index)
        return energies, self.networks.last_layer_features(features, element_index)
