"""Sizes a model reads from its data, not from its inputs' shapes: the most pairs one
atom has, how many atoms of each element a batch holds. Eagerly and in TorchScript
they are plain numbers. While training/compiled.py traces a step with make_fx they are
read from the real tensors behind the tracer and enter the graph as constants; that
graph is then used only for batches of the same sizes (compiled.BatchShape).

Models read every such size through these functions, which the tracer records, so that
it can refuse a graph holding a size it does not know how to key.
"""

from __future__ import annotations

import torch

# while a step is traced: the values read so far, in order
_recorded: list[list[list[int]]] = []


def bucket(count: int) -> int:
    """``count`` rounded up to one of eight sizes per octave (at most 12.5 % more)."""
    if count <= 8:
        return count
    step = 1 << (count.bit_length() - 4)
    return -(-count // step) * step


def data_width(value: torch.Tensor) -> int:
    """``int(value)`` of a one-element tensor computed from the data, used as a width
    for which any larger one would do (the most pairs of an atom, as the width of a
    padded layout): a traced graph holds it rounded up (``bucket``), and so serves every
    batch whose own value is no larger."""
    if torch.jit.is_scripting():
        return int(value)
    return _read(value, True)[0]


def data_list(value: torch.Tensor) -> list[int]:
    """``value.tolist()`` of a 1-d integer tensor computed from the data, exactly."""
    if torch.jit.is_scripting():
        numbers: list[int] = value.tolist()
        return numbers
    return _read(value, False)


@torch.jit.unused
def _read(value: torch.Tensor, width: bool) -> list[int]:
    if not _recorded:
        return [int(number) for number in value.reshape(-1).tolist()]
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with disable_proxy_modes_tracing():
        numbers = [int(number) for number in value.reshape(-1).tolist()]
    if width:
        numbers = [bucket(number) for number in numbers]
    _recorded[-1].append(numbers)
    return numbers


class RecordedSizes:
    """Within the block, every size read is recorded in ``values``."""

    def __init__(self) -> None:
        self.values: list[list[int]] = []

    def __enter__(self) -> RecordedSizes:
        _recorded.append(self.values)
        return self

    def __exit__(self, *_: object) -> None:
        _recorded.pop()


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
