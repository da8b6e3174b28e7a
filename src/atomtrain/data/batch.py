"""Flat batches: structures concatenated, with an atom-to-structure index."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch


@dataclass
class Batch:
    """Several structures as flat tensors; pair indices point into the flat atom arrays."""

    positions: torch.Tensor  # [n_atoms, 3]
    atomic_numbers: torch.Tensor  # [n_atoms]
    system_index: torch.Tensor  # [n_atoms], structure of each atom
    cell: torch.Tensor  # [n_structures, 3, 3]
    periodic: torch.Tensor  # [n_structures] bool, any direction periodic
    pair_first: torch.Tensor  # [n_pairs]
    pair_second: torch.Tensor  # [n_pairs]
    cell_shifts: torch.Tensor  # [n_pairs, 3], float like positions
    n_atoms: torch.Tensor  # [n_structures]
    energy: torch.Tensor | None = None  # [n_structures]
    forces: torch.Tensor | None = None  # [n_atoms, 3], zeros where unknown
    stress: torch.Tensor | None = None  # [n_structures, 3, 3], zeros where unknown
    # which atoms' forces (structures' stresses) are known, when not all are
    forces_mask: torch.Tensor | None = None  # [n_atoms] bool
    stress_mask: torch.Tensor | None = None  # [n_structures] bool
    # mtt:: targets: [n_structures, width] or, per atom, [n_atoms, width]; zeros where
    # unknown, and then a mask of the known samples ([n_structures] or [n_atoms] bool)
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    target_masks: dict[str, torch.Tensor] = field(default_factory=dict)
    atom_targets: tuple[str, ...] = ()  # the mtt:: targets given per atom
    # which of the model's energies each structure's is (energy variants), None: the first
    energy_variant: torch.Tensor | None = None  # [n_structures] long
    weights: torch.Tensor | None = None  # [n_structures] float64 loss weights, None: all 1

    @property
    def n_structures(self) -> int:
        return int(self.n_atoms.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype) -> Batch:
        moved = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, torch.Tensor):
                # total energies stay float64: they can be large (-20000 eV)
                keep = item.name == "energy" or not value.is_floating_point()
                value = value.to(device=device, dtype=None if keep else dtype)
            elif isinstance(value, dict):  # mtt:: targets (float64, like energies) and masks
                value = {name: tensor.to(device=device) for name, tensor in value.items()}
            moved[item.name] = value
        return Batch(**moved)


def empty_batch(
    energy: bool, forces: bool, stress: bool, widths: dict[str, int] | None = None
) -> Batch:
    """A batch of no structure: a rank whose share of a short batch is empty still
    runs the model on it, so it takes part in the gradient reduction."""
    real = torch.zeros((0, 3), dtype=torch.float64)
    index = torch.zeros(0, dtype=torch.long)
    return Batch(
        positions=real,
        atomic_numbers=index,
        system_index=index,
        cell=torch.zeros((0, 3, 3), dtype=torch.float64),
        periodic=torch.zeros(0, dtype=torch.bool),
        pair_first=index,
        pair_second=index,
        cell_shifts=real,
        n_atoms=index,
        energy=torch.zeros(0, dtype=torch.float64) if energy else None,
        forces=real if forces else None,
        stress=torch.zeros((0, 3, 3), dtype=torch.float64) if stress else None,
        targets={
            name: torch.zeros((0, width), dtype=torch.float64)
            for name, width in (widths or {}).items()
        },
    )
