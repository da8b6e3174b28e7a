"""Targets other than the energy, named and typed as metatrain names and types them:
``mtt::<name>`` entries of a data set's ``targets`` section, each a scalar, a Cartesian
tensor of rank 1 or 2, or a list of spherical irreps (o3_lambda, o3_sigma), per structure
or per atom, with ``num_subtargets`` properties; and metatrain's non-conservative
forces and stress (``non_conservative_forces``, ``non_conservative_stress``), which a
head predicts directly, exported as metatomic's outputs of those names.

A target's values are held flat, per structure (or per atom): its components in the
order metatrain's ASE reader reshapes them, ``[*components, subtargets]`` row-major,
and for spherical targets one block after the other. A :class:`TargetSpec` is what the
options, the data readers, the model's heads and the exporter share; it is plain data
(its ``record`` goes into checkpoints and exported models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PREFIX = "mtt::"
# metatomic's standard outputs that a head predicts directly (metatrain's
# non-conservative forces and stress): each atom's force as a vector, and the stress as
# a symmetric 3x3 matrix per structure, its atoms' contributions summed over the cell's
# volume, as metatrain's PET makes it
NON_CONSERVATIVE_FORCE = "non_conservative_force"
NON_CONSERVATIVE_STRESS = "non_conservative_stress"
# the names metatrain's options and older engines (i-PI) still use
OLD_NAMES = {"non_conservative_forces": NON_CONSERVATIVE_FORCE}
# what each is, unless the options say otherwise (metatrain's options give these)
DIRECT_DEFAULTS: dict[str, dict[str, Any]] = {
    NON_CONSERVATIVE_FORCE: {
        "key": "forces",
        "quantity": "force",
        "type": {"cartesian": {"rank": 1}},
        "per_atom": True,
    },
    NON_CONSERVATIVE_STRESS: {
        "key": "stress",
        "quantity": "pressure",
        "type": {"cartesian": {"rank": 2}},
        "per_atom": False,
    },
}
# the largest o3_lambda the heads build (models/heads.py): scalars, vectors and
# symmetric traceless matrices, proper or pseudo
MAX_LAMBDA = 2


@dataclass(frozen=True)
class Irrep:
    o3_lambda: int
    o3_sigma: int

    @property
    def size(self) -> int:
        return 2 * self.o3_lambda + 1


@dataclass(frozen=True)
class TargetSpec:
    """One target other than the energy."""

    name: str  # "mtt::dipole"
    key: str  # where the values are in the file (info, or arrays when per atom)
    kind: str  # "scalar", "cartesian" or "spherical"
    rank: int = 0  # Cartesian rank (1 or 2)
    irreps: tuple[Irrep, ...] = ()  # spherical blocks, in order
    per_atom: bool = False
    num_subtargets: int = 1
    unit: str = ""
    quantity: str = ""
    description: str = ""

    @property
    def components(self) -> int:
        """Values per sample and subtarget (all blocks of a spherical target)."""
        if self.kind == "scalar":
            return 1
        if self.kind == "cartesian":
            return 3**self.rank
        return sum(irrep.size for irrep in self.irreps)

    @property
    def width(self) -> int:
        """Values per sample (structure, or atom when per atom)."""
        return self.components * self.num_subtargets

    def shape_in_file(self) -> tuple[int, ...]:
        """The shape of one sample's values (metatrain's ``[*components, properties]``)."""
        if self.kind == "cartesian":
            return (*([3] * self.rank), self.num_subtargets)
        if self.kind == "spherical" and len(self.irreps) == 1:
            return (self.irreps[0].size, self.num_subtargets)
        return (self.components, self.num_subtargets)

    @property
    def symmetric(self) -> bool:
        """A symmetric rank-2 tensor (the stress, which a file may hold in Voigt's six
        values; its head, pair_heads.PairHead, makes it symmetric)."""
        return self.name == NON_CONSERVATIVE_STRESS

    @property
    def per_volume(self) -> bool:
        return is_per_volume(self.name)

    def blocks(self) -> list[Irrep]:
        """The irreps the heads make for it: a Cartesian rank-2 tensor is its trace (0, 1),
        its antisymmetric part (1, -1) and its symmetric traceless part (2, 1)."""
        if self.kind == "scalar":
            return [Irrep(0, 1)]
        if self.kind == "cartesian":
            return [Irrep(1, 1)] if self.rank == 1 else [Irrep(0, 1), Irrep(1, -1), Irrep(2, 1)]
        return list(self.irreps)

    def isotropic_positions(self) -> list[int] | None:
        """Where its o3_lambda 0 part sits among each subtarget's components (the
        positions whose mean is that part: a tensor's diagonal), or None without one.
        Per-element baselines are fitted to this part only."""
        if self.kind == "scalar":
            return [0]
        if self.kind == "cartesian":
            return [0, 4, 8] if self.rank == 2 else None
        offset = 0
        for irrep in self.irreps:
            if (irrep.o3_lambda, irrep.o3_sigma) == (0, 1):
                return [offset]
            offset += irrep.size
        return None

    def isotropic(self, values: np.ndarray) -> np.ndarray | None:
        """[rows, width] -> [rows, subtargets]: the o3_lambda 0 part of each subtarget."""
        positions = self.isotropic_positions()
        if positions is None:
            return None
        shaped = values.reshape(values.shape[0], self.components, self.num_subtargets)
        return shaped[:, positions, :].mean(axis=1)

    def without_isotropic(self, values: np.ndarray, isotropic: np.ndarray) -> np.ndarray:
        """[rows, width] less an o3_lambda 0 part [rows, subtargets]."""
        positions = self.isotropic_positions()
        if positions is None:
            return values
        shaped = values.reshape(values.shape[0], self.components, self.num_subtargets).copy()
        shaped[:, positions, :] -= isotropic[:, None, :]
        return shaped.reshape(values.shape)

    def record(self) -> dict[str, Any]:
        """As plain data, for checkpoints and exported models."""
        return {
            "name": self.name,
            "key": self.key,
            "kind": self.kind,
            "rank": self.rank,
            "irreps": [[irrep.o3_lambda, irrep.o3_sigma] for irrep in self.irreps],
            "per_atom": self.per_atom,
            "num_subtargets": self.num_subtargets,
            "unit": self.unit,
            "quantity": self.quantity,
            "description": self.description,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TargetSpec:
        fields = dict(record)
        fields["irreps"] = tuple(Irrep(int(a), int(b)) for a, b in fields.get("irreps", []))
        return cls(**fields)


def is_energy(name: str) -> bool:
    """``energy`` or one of its variants, ``energy/<variant>``."""
    return name == "energy" or name.startswith("energy/")


def is_per_volume(name: str) -> bool:
    """A structure's value is its atoms' sum over the cell's volume (zero for a structure
    that is not periodic), as a stress is its virial over the volume; its loss, as the
    stress's, is taken on that sum per atom."""
    return name == NON_CONSERVATIVE_STRESS


def canonical_name(name: str) -> str:
    """A target's name as atomtrain and metatomic spell it now."""
    return OLD_NAMES.get(name, name)


def is_direct(name: str) -> bool:
    """A non-conservative force or stress, predicted by a head of its own."""
    return canonical_name(name) in DIRECT_DEFAULTS


def is_other_target(name: str) -> bool:
    """A target other than the energies: mtt::<name>, or a non-conservative force or
    stress."""
    return name.startswith(PREFIX) or is_direct(name)


def target_of_metric(key: str) -> str | None:
    """The target other than the energies that a metric (``<target>_rmse``, ``_mae``)
    measures, or None."""
    for suffix in ("_rmse", "_mae"):
        if key.endswith(suffix) and is_other_target(key.removesuffix(suffix)):
            return key.removesuffix(suffix)
    return None


def unsupported_irrep(irrep: Irrep) -> str | None:
    """Why the heads cannot make ``irrep``, or None."""
    if irrep.o3_sigma not in (1, -1):
        return f"o3_sigma must be 1 or -1, got {irrep.o3_sigma}"
    if irrep.o3_lambda < 0:
        return f"o3_lambda must be 0 or more, got {irrep.o3_lambda}"
    if irrep.o3_lambda > MAX_LAMBDA:
        return f"o3_lambda {irrep.o3_lambda}: atomtrain's heads make o3_lambda up to {MAX_LAMBDA}"
    if irrep == Irrep(0, -1):
        return "a pseudoscalar (o3_lambda 0, o3_sigma -1) cannot be made by atomtrain's heads"
    return None
