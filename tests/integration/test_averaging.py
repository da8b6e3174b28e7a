"""The weights' moving average (architecture.training.ema_decay): its rule, that
validation, the best model and the export use it, that a stopped run resumes it exactly
on two processes, and its bad values."""

from __future__ import annotations

import pytest
import torch

from atomtrain.cli.main import main
from atomtrain.training.averaging import WeightAverage

from test_faults import (
    EPOCHS,
    assert_same_model,
    options_in,
    run_uninterrupted,
    stop_then_resume_with_two,
)


def test_the_average_follows_torch_emas_rule_and_gives_the_weights_back():
    weights = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    average = WeightAverage([weights], decay=0.9)
    expected = weights.detach().clone()
    for step in range(1, 40):
        with torch.no_grad():
            weights.add_(torch.tensor([0.5, 0.25], dtype=torch.float64))
        average.update()
        decay = min(0.9, (1 + step) / (10 + step))
        expected = decay * expected + (1 - decay) * weights.detach()
    torch.testing.assert_close(average.averages[0], expected, rtol=1e-14, atol=0)
    own = weights.detach().clone()
    with average.applied():
        assert torch.equal(weights.detach(), average.averages[0])
    assert torch.equal(weights.detach(), own)  # bitwise back


def averaged_run(directory, **changes):
    directory.mkdir(parents=True, exist_ok=True)
    options = options_in(directory, architecture__training__ema_decay=0.9, **changes)
    return options, directory / "run"


def run_to_the_end(options, run_dir):
    run_uninterrupted(options, run_dir)
    return torch.load(run_dir / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_the_best_model_is_the_average_and_a_stopped_run_resumes_it_on_two_processes(
    tmp_path,
):
    """Uninterrupted, the best model (which model.pt exports) is the average of its
    epoch, not the weights; stopped after its second epoch and resumed on two processes,
    a run ends at the same weights and the same average."""
    options, run_dir = averaged_run(tmp_path / "uninterrupted")
    uninterrupted = run_to_the_end(options, run_dir)
    average = uninterrupted["average_state"]
    assert average["updates"] == EPOCHS * 7  # 28 training structures, 4 a step
    # best.ckpt, written at the best epoch: its best model is that epoch's average
    best = torch.load(run_dir / "best.ckpt", weights_only=True)
    averaged = dict(zip(trainable_names(best), best["average_state"]["averages"]))
    for name, value in averaged.items():
        assert torch.equal(best["best_model_state"][name], value), name
    assert any(not torch.equal(best["model_state"][name], v) for name, v in averaged.items())

    options, run_dir = averaged_run(tmp_path / "resumed")
    stop_then_resume_with_two(options, run_dir, EPOCHS)
    resumed = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert_same_model(resumed["model_state"], uninterrupted["model_state"])
    assert resumed["average_state"]["updates"] == average["updates"]
    for ours, theirs in zip(resumed["average_state"]["averages"], average["averages"]):
        assert (ours - theirs).abs().max() <= 1e-8 * theirs.abs().max().clamp_min(1e-12)


def trainable_names(state) -> list[str]:
    """The parameters' names in the order the optimizer holds them (the model's
    named_parameters order), from a checkpoint's model."""
    from atomtrain.training.checkpoint import TrainingState, model_from_checkpoint

    model = model_from_checkpoint(TrainingState.from_dict(state))
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.2])
def test_an_ema_decay_outside_zero_to_one_is_one_line(tmp_path, capsys, value):
    options = options_in(tmp_path, architecture__training__ema_decay=value)
    assert main(["train", str(options), "--check"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "ema_decay" in error
