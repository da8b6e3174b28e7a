"""One small neural network per element (Behler-Parrinello)."""

from __future__ import annotations

import torch


def element_network(n_inputs: int, n_hidden_layers: int, n_neurons: int) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    width = n_inputs
    for _ in range(n_hidden_layers):
        layers += [torch.nn.Linear(width, n_neurons), torch.nn.SiLU()]
        width = n_neurons
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


class ElementNetworks(torch.nn.Module):
    """Maps each atom's features to an atomic energy with its element's network.

    Every network runs on every call, on zero rows when the batch lacks its element, so
    all parameters take part in each backward pass (data-parallel training needs this).
    """

    def __init__(self, n_elements: int, n_inputs: int, n_hidden_layers: int, n_neurons: int):
        super().__init__()
        self.networks = torch.nn.ModuleList(
            [element_network(n_inputs, n_hidden_layers, n_neurons) for _ in range(n_elements)]
        )

    def forward(self, features: torch.Tensor, element_index: torch.Tensor) -> torch.Tensor:
        energies = torch.zeros(features.shape[0], dtype=features.dtype, device=features.device)
        for element, network in enumerate(self.networks):
            atoms = torch.nonzero(element_index == element).reshape(-1)
            energies = energies.index_put(
                (atoms,), network(features.index_select(0, atoms)).reshape(-1)
            )
        return energies
