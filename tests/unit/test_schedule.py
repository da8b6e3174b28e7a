"""The learning-rate schedules: warmup, then a cosine to zero or a constant rate."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from atomtrain.options import TrainingOptions
from atomtrain.training.schedule import (
    Plateau,
    apply_now,
    make_optimizer,
    make_scheduler,
    warmup_then,
)


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


def test_plateau_lowers_the_rate_as_torchs_reduce_lr_on_plateau_does():
    """The same validation errors give the same rates as torch's ReduceLROnPlateau (what
    mace_run_train and metatrain's MACE use), ties and relative improvements below the
    threshold counted as no improvement."""
    errors = [5.0, 4.0, 4.0, 3.9999, 4.1, 3.0, 3.0, 3.0, 3.0, 2.0, 2.5, 2.5, 2.5, 2.5, 1.0]
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.01)
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.8, patience=2)
    plateau = Plateau(factor=0.8, patience=2)
    expected, actual = [], []
    for error in errors:
        reference.step(error)
        expected.append(optimizer.param_groups[0]["lr"])
        plateau.validated(error)
        actual.append(0.01 * plateau.scale)
    assert actual == pytest.approx(expected, rel=1e-12)
    assert len(set(expected)) >= 3  # the sequence lowers the rate more than once
    restored = Plateau(factor=0.8, patience=2)
    restored.load_state_dict(plateau.state_dict())
    assert restored == plateau


def test_a_lowered_rate_applies_from_the_next_step():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.01)
    plateau = Plateau(factor=0.5, patience=0)
    training = TrainingOptions(
        num_epochs=100, warmup_fraction=0.0, lr_scheduler="ReduceLROnPlateau"
    )
    scheduler = make_scheduler(optimizer, training, 1, plateau)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    plateau.validated(1.0)
    assert plateau.validated(1.0)  # no improvement, patience 0: lowered
    apply_now(scheduler)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)


def test_exponential_decay_is_per_epoch():
    factor = warmup_then(100, 0.0, "ExponentialLR", steps_per_epoch=10, gamma=0.9)
    assert [factor(step) for step in (0, 9, 10, 25, 99)] == pytest.approx(
        [1.0, 1.0, 0.9, 0.81, 0.9**9]
    )


def test_the_optimizer_is_adam_or_adamw_with_the_sections_settings():
    parameters = [("weight", torch.nn.Parameter(torch.zeros(2)))]
    adam = make_optimizer(parameters, TrainingOptions())
    assert isinstance(adam, torch.optim.Adam) and adam.param_groups[0]["betas"] == (0.9, 0.999)
    training = TrainingOptions(optimizer="adamw", beta=0.8, weight_decay=0.1, amsgrad=True)
    adamw = make_optimizer(parameters, training)
    (group,) = adamw.param_groups
    assert isinstance(adamw, torch.optim.AdamW)
    assert (group["betas"], group["weight_decay"], group["amsgrad"]) == ((0.8, 0.999), 0.1, True)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_the_optimizer_updates_exactly_as_torchs_and_shares_its_state(optimizer):
    """atomtrain's optimizer is torch's, without its guards against torch.compile (each
    imports torch._dynamo): the same parameters bit for bit, the same state dict both
    ways (a checkpoint of either kind resumes in the other)."""
    training = TrainingOptions(optimizer=optimizer, weight_decay=0.01, amsgrad=True)
    torch.manual_seed(0)
    start = torch.randn(4, 3, dtype=torch.float64)
    ours = torch.nn.Parameter(start.clone())
    theirs = torch.nn.Parameter(start.clone())
    kind = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    optimizer_ours = make_optimizer([("weight", ours)], training)
    defaults = {key: optimizer_ours.defaults[key] for key in ("lr", "betas", "weight_decay")}
    optimizer_theirs = kind([theirs], amsgrad=True, fused=True, **defaults)
    for step in range(4):
        for parameter, update in ((ours, optimizer_ours), (theirs, optimizer_theirs)):
            update.zero_grad()
            (parameter.sin() * (step + 1)).sum().backward()
            update.step()
        assert not ours.grad_fn and ours.requires_grad
        assert torch.equal(ours, theirs), step
    state = optimizer_ours.state_dict()
    assert torch.equal(state["state"][0]["exp_avg"], optimizer_theirs.state[theirs]["exp_avg"])
    optimizer_theirs.load_state_dict(state)
    optimizer_ours.load_state_dict(optimizer_theirs.state_dict())


def test_the_optimizer_does_not_import_torch_dynamo():
    """torch._dynamo's import took 0.9-1.5 s of every run's start, for guards that never
    act in atomtrain (it compiles the predictions, never the optimizer)."""
    script = """
import sys, torch
from atomtrain.options import TrainingOptions
from atomtrain.training.schedule import make_optimizer, make_scheduler, Plateau
weight = torch.nn.Parameter(torch.ones(3))
optimizer = make_optimizer([("weight", weight)], TrainingOptions())
scheduler = make_scheduler(optimizer, TrainingOptions(num_epochs=2), 1, Plateau(0.5, 1))
(weight ** 2).sum().backward()
optimizer.step()
scheduler.step()
optimizer.zero_grad()
optimizer.load_state_dict(optimizer.state_dict())
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_weight_decay_spares_the_parameters_the_architecture_names():
    """MACE's convention (mace_run_train's get_params_options): decay on the products and
    the interactions' linear and skip weights only."""
    from atomtrain.models.mace.plugin import decays

    names = [
        "mace.node_embedding.linear.weight",
        "mace.interactions.0.linear_up.weight",
        "mace.interactions.0.conv_tp_weights.layer0.weight",
        "mace.interactions.0.linear.weight",
        "mace.interactions.1.skip_tp_full.weight",
        "mace.products.0.symmetric_contractions.contractions.0.weights_max",
        "mace.products.0.linear.weight",
        "mace.readouts.0.linear.weight",
    ]
    parameters = [(name, torch.nn.Parameter(torch.zeros(1))) for name in names]
    optimizer = make_optimizer(parameters, TrainingOptions(weight_decay=0.01), decays)
    decayed, spared = optimizer.param_groups
    assert decayed["weight_decay"] == 0.01 and spared["weight_decay"] == 0.0
    by_identity = {id(parameter): name for name, parameter in parameters}
    assert [by_identity[id(p)] for p in decayed["params"]] == names[3:7]
    assert [by_identity[id(p)] for p in spared["params"]] == names[:3] + names[7:]
