"""Sizes a model reads from its data, not from its inputs' shapes: the most pairs one
atom has, how many atoms of each element a batch holds. Eagerly and in TorchScript
they are numbers computed from the data. A graph traced for every batch size
(training/compiled.py) cannot read values from its data: there they are symbolic sizes
of inputs the tracer adds, and models read every such size through these functions.
"""

from typing import Any

import torch

# while a step is traced: the sizes the tracer gives, by kind (see ProvidedSizes)
_provided: list[dict[str, Any]] = []


def bucket(count: int) -> int:
    """``count`` rounded up to one of eight sizes per octave (at most 12.5 % more)."""
    if count <= 8:
        return count
    step = 1 << (count.bit_length() - 4)
    return -(-count // step) * step


def most_pairs(counts: torch.Tensor, per_element: bool) -> int:
    """The largest of ``counts``: how many pairs an atom is the first of, or (with
    ``per_element``) how many it has with neighbors of one element. Models use it as a
    width for which any larger one would do."""
    if torch.jit.is_scripting() or not _given():
        return int(counts.max()) if counts.shape[0] > 0 else 0
    return _given_size("pairs_per_element" if per_element else "pairs")


def atoms_per_element(counts: torch.Tensor) -> list[int]:
    """``counts.tolist()``: how many atoms of each of the model's elements."""
    if torch.jit.is_scripting() or not _given():
        numbers: list[int] = counts.tolist()
        return numbers
    return _given_elements()


@torch.jit.unused
def _given() -> bool:
    return bool(_provided)


@torch.jit.unused
def traced() -> bool:
    """A step is being traced for compilation (ProvidedSizes is in force): a model may
    take a formulation that compiles better than the one that runs best eagerly."""
    return _given()


@torch.jit.unused
def _given_size(kind: str) -> int:
    return _provided[-1][kind]


@torch.jit.unused
def _given_elements() -> list[int]:
    return _provided[-1]["atoms_per_element"]


class ProvidedSizes:
    """Within the block, models read the sizes given here (the symbolic sizes of a
    traced graph's inputs) instead of computing them from their data."""

    def __init__(self, pairs: Any, pairs_per_element: Any, elements: list[Any]) -> None:
        self.sizes = {
            "pairs": pairs,
            "pairs_per_element": pairs_per_element,
            "atoms_per_element": elements,
        }

    def __enter__(self) -> "ProvidedSizes":
        _provided.append(self.sizes)
        return self

    def __exit__(self, *_: object) -> None:
        _provided.pop()


def occurrences(index: torch.Tensor, length: int) -> torch.Tensor:
    """How often each of 0 .. length - 1 occurs in ``index``: ``torch.bincount`` with
    ``minlength=length`` and no larger index, whose output's shape is known before its
    values (a compiled graph cannot hold a bincount's)."""
    counts = torch.zeros(length, dtype=index.dtype, device=index.device)
    return counts.scatter_add_(0, index, torch.ones_like(index))


def one_hot(index: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.nn.functional.one_hot(index, length).to(dtype)`` without its check of the
    largest index, which reads a value from the data (a traced graph cannot)."""
    classes = torch.arange(length, device=index.device, dtype=index.dtype)
    return (index.unsqueeze(-1) == classes).to(dtype)
