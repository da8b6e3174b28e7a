"""MACE as an atomtrain energy model: mace-torch's ScaleShiftMACE, unchanged, fed the
neighbor pairs' vectors. The trainer's baseline and scale go around it (its own E0s are
zero, its scale one and shift zero, for a model built here)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..energy_model import EnergyModel
from . import ARCHITECTURE_NAME
from .library import import_mace
from .options import ModelOptions

mace_modules, o3, jit = import_mace()


def new_mace(options: ModelOptions, atomic_types: list[int], average_neighbors: float):
    """mace-torch's ScaleShiftMACE with the section's hyperparameters, in float64."""
    interactions = mace_modules.interaction_classes
    edge_irreps = o3.Irreps(options.edge_irreps) if options.edge_irreps is not None else None
    return ScaleShiftMACE(
        atomic_inter_scale=1.0,
        atomic_inter_shift=0.0,
        r_max=options.r_max,
        num_bessel=options.num_radial_basis,
        num_polynomial_cutoff=options.num_cutoff_basis,
        max_ell=options.max_ell,
        interaction_cls=interactions[options.interaction],
        interaction_cls_first=interactions[options.interaction_first],
        num_interactions=options.num_interactions,
        num_elements=len(atomic_types),
        hidden_irreps=o3.Irreps(options.hidden_irreps),
        edge_irreps=edge_irreps,
        MLP_irreps=o3.Irreps(options.MLP_irreps),
        atomic_energies=np.zeros(len(atomic_types)),
        avg_num_neighbors=average_neighbors,
        atomic_numbers=atomic_types,
        correlation=options.correlation,
        gate=mace_modules.gate_dict[options.gate] if options.gate is not None else None,
        pair_repulsion=options.pair_repulsion,
        apply_cutoff=options.apply_cutoff,
        distance_transform=str(options.distance_transform),
        radial_MLP=options.radial_MLP,
        radial_type=options.radial_type,
        use_embedding_readout=options.use_embedding_readout,
        use_last_readout_only=options.use_last_readout_only,
        use_agnostic_product=options.use_agnostic_product,
    ).to(torch.float64)


ScaleShiftMACE = mace_modules.ScaleShiftMACE


@jit.compile_mode("script")
class MaceModel(EnergyModel):
    """Atomic energy: MACE's node energy of the atom's environment within r_max."""

    def __init__(self, atomic_types: list[int], options: ModelOptions, average_neighbors: float):
        hypers = {
            "architecture": ARCHITECTURE_NAME,
            "atomic_types": list(atomic_types),
            "model": options.model_dump(mode="json"),
            "facts": {"average_neighbors": float(average_neighbors)},
        }
        super().__init__(hypers, options.r_max)
        self.n_types = len(self.atomic_types)
        with warnings.catch_warnings():
            # e3nn scripts parts of itself while built, and TorchScript warns about
            # annotations in e3nn's code, which no user can act on
            warnings.filterwarnings("ignore", "The TorchScript type system", UserWarning)
            self.mace = new_mace(options, self.atomic_types, float(average_neighbors))

    def set_precision(self, dtype: torch.dtype) -> MaceModel:
        self.mace.to(dtype)
        return self

    @torch.jit.unused
    def details(self) -> list[str]:
        model = self.hypers["model"]
        return [
            f"{model['num_interactions']} interactions of {model['hidden_irreps']}",
            f"correlation {model['correlation']}",
            f"{self.hypers['facts']['average_neighbors']:.2f} neighbors on average",
        ]

    def atomic_outputs(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        # MACE takes each edge's vector as positions[receiver] - positions[sender] +
        # shifts: with all positions at zero, the shifts are the vectors themselves,
        # exactly, and the derivatives flow back to them
        dtype = self.baseline_dtype()
        vectors = edge_vectors.to(dtype)
        if mirrored:
            vectors = torch.cat([vectors, -vectors])
        n_atoms = element_index.shape[0]
        device = vectors.device
        data = {
            "positions": torch.zeros((n_atoms, 3), dtype=dtype, device=device),
            "node_attrs": torch.nn.functional.one_hot(element_index, self.n_types).to(dtype),
            "edge_index": torch.stack([pair_first, pair_second]),
            "shifts": vectors,
            "unit_shifts": torch.zeros_like(vectors),
            "cell": torch.zeros((1, 3, 3), dtype=dtype, device=device),
            # one graph: per-atom energies do not depend on how atoms group into systems
            "batch": torch.zeros(n_atoms, dtype=torch.long, device=device),
            "ptr": torch.tensor([0, n_atoms], dtype=torch.long, device=device),
        }
        outputs = self.mace(data, training=self.training, compute_force=False)
        energies = outputs["node_energy"]
        assert energies is not None
        return energies

    def baseline_dtype(self) -> torch.dtype:
        """The dtype MACE's parameters are in."""
        return self.mace.atomic_energies_fn.atomic_energies.dtype
