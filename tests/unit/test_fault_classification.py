"""Which collective errors mean "a peer is gone" (answered with a roll call and a
one-line message naming the peer) and which are ordinary errors."""

from __future__ import annotations

import pytest

from atomtrain.distributed.faults import is_communication_error


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        "Application timeout caused pair closure",
        "[c10d] Socket Timeout",
        "Broken pipe",
    ],
)
def test_collective_failures_are_communication_errors(message):
    assert is_communication_error(RuntimeError(message))


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"),
        ValueError("Connection settings are invalid"),
        OSError("No space left on device"),
    ],
)
def test_other_errors_are_not(error):
    assert not is_communication_error(error)
