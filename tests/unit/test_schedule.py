"""The learning-rate schedules: warmup, then a cosine to zero or a constant rate."""

from __future__ import annotations

import pytest

from atomtrain.training.schedule import warmup_then


@pytest.mark.parametrize("after", ["cosine", "constant"])
def test_warmup_then_cosine_or_constant(after):
    factor = warmup_then(total_steps=100, warmup_fraction=0.1, after=after)
    assert [factor(step) for step in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert factor(10) == pytest.approx(1.0)
    if after == "cosine":
        assert factor(55) == pytest.approx(0.5)
        assert factor(99) < 0.001
    else:
        assert [factor(step) for step in (10, 55, 99)] == [1.0, 1.0, 1.0]
