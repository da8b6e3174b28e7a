"""Per-element energy baseline fitted by linear least squares, in float64.

The fit works from sums (the normal equations X^T X w = X^T y), so shards of the
training set can each add their part and the result does not depend on how the data
was split among processes. The pseudo-inverse gives the minimum-norm solution when the
compositions are collinear (e.g. every structure is C2H6O).
"""

from __future__ import annotations

import torch


def composition_counts(
    atomic_numbers: torch.Tensor,
    system_index: torch.Tensor,
    n_structures: int,
    atomic_types: list[int],
) -> torch.Tensor:
    """Number of atoms of each element in each structure, [n_structures, n_elements]."""
    lookup = torch.full((max(atomic_types) + 1,), -1, dtype=torch.long)
    lookup[torch.tensor(atomic_types)] = torch.arange(len(atomic_types))
    element_index = lookup[atomic_numbers]
    counts = torch.zeros((n_structures, len(atomic_types)), dtype=torch.float64)
    counts.index_put_(
        (system_index, element_index),
        torch.ones(len(element_index), dtype=torch.float64),
        accumulate=True,
    )
    return counts


def normal_equation_sums(
    counts: torch.Tensor, energies: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """X^T X and X^T y for one shard of the training set."""
    counts = counts.to(torch.float64)
    return counts.T @ counts, counts.T @ energies.to(torch.float64)


def solve_baseline(gram: torch.Tensor, moment: torch.Tensor) -> torch.Tensor:
    """Per-element energies from the summed normal equations (minimum norm)."""
    # directions the data cannot tell apart (collinear compositions) must be cut, not
    # inverted from rounding noise: hence a relative tolerance well above float64's
    return torch.linalg.pinv(gram, hermitian=True, rtol=1e-10) @ moment


def determined_directions(gram: torch.Tensor, rtol: float = 1e-10) -> torch.Tensor:
    """Orthonormal rows spanning the compositions behind ``gram`` (X^T X): along them the
    data fixes the per-element energies; along the others any value fits it equally."""
    values, vectors = torch.linalg.eigh(gram.to(torch.float64))
    if values.numel() == 0 or float(values.max()) <= 0:
        return torch.zeros((0, gram.shape[0]), dtype=torch.float64)
    return vectors[:, values > rtol * values.max()].T.contiguous()


def undetermined_directions(span: torch.Tensor, n_elements: int) -> torch.Tensor:
    """Orthonormal columns completing the rows of ``span`` to all of R^n_elements."""
    projector = torch.eye(n_elements, dtype=torch.float64) - span.T @ span
    values, vectors = torch.linalg.eigh(projector)
    return vectors[:, values > 0.5].contiguous()


def incomplete_span(record: list[list[float]] | None, n_elements: int) -> torch.Tensor | None:
    """A model's recorded ``baseline_span`` as rows [m, n_elements], or None when there
    is none (an older model) or it spans every composition (nothing undetermined)."""
    if record is None or len(record) >= n_elements:
        return None
    return torch.tensor(record, dtype=torch.float64).reshape(-1, n_elements)


def outside_span(span: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Whether each composition (a row of element counts) has a part that the rows of
    ``span`` (orthonormal, from determined_directions) do not reach: a composition
    whose baseline energy the training data left arbitrary."""
    counts = counts.to(torch.float64)
    remainder = counts - (counts @ span.T) @ span
    return remainder.norm(dim=1) > 1e-8 * counts.norm(dim=1).clamp_min(1.0)


def undetermined_note(subject: str) -> str:
    """What a user is told of structures outside the determined compositions:
    ``subject`` says which ('3 of 40 structures (a.xyz) have')."""
    return (
        f"{subject} a composition the model's training data "
        "did not determine the per-element energies for (e.g. it saw one composition "
        "only): their total energies include an arbitrary per-element part; forces, and "
        "energy differences between structures of one composition, are unaffected"
    )
