"""The training state a checkpoint holds: one typed record that names its keys, saved
as plain data, and a version chain that upgrades what an older atomtrain wrote."""

from __future__ import annotations

import pytest
import torch

from atomtrain.errors import AtomtrainError
from atomtrain.training import checkpoint
from atomtrain.training.checkpoint import TrainingState, load_checkpoint, save_checkpoint


def state() -> TrainingState:
    return TrainingState(
        architecture="soap_bpnn",
        hypers={"architecture": "soap_bpnn", "atomic_types": [1]},
        dtype="float64",
        model_state={"weight": torch.ones(2)},
        seed=3,
        epoch=2,
        step=5,
        epoch_sums=torch.arange(3.0),
    )


def test_a_state_round_trips_through_a_file_loadable_with_weights_only(tmp_path):
    path = tmp_path / "last.ckpt"
    save_checkpoint(path, state())
    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["format"] == checkpoint.FORMAT and "plateau_state" not in raw  # None: left out
    loaded = load_checkpoint(path)
    assert (loaded.epoch, loaded.step, loaded.seed) == (2, 5, 3)
    assert torch.equal(loaded.epoch_sums, torch.arange(3.0))
    assert loaded.plateau_state is None and loaded.best_metric == float("inf")


def test_an_older_version_is_upgraded_along_the_chain(tmp_path, monkeypatch):
    """A checkpoint of the version before the current one goes through its upgrade."""
    previous = checkpoint.VERSION - 1
    written = state().to_dict() | {"format": f"atomtrain-checkpoint-{previous}"}
    written["steps_done"] = written.pop("step")  # as if the key had another name then

    def rename(old: dict) -> dict:
        old["step"] = old.pop("steps_done")
        return old

    monkeypatch.setitem(checkpoint.UPGRADES, previous, rename)
    path = tmp_path / "old.ckpt"
    torch.save(written, path)
    assert load_checkpoint(path).step == 5
    monkeypatch.delitem(checkpoint.UPGRADES, previous)
    with pytest.raises(AtomtrainError, match="cannot be upgraded"):
        load_checkpoint(path)


def test_a_model_state_of_the_first_llpr_format_loads_with_its_uncertainty():
    """The first LLPR format (one energy: its matrices whole, a scalar multiplier) loads
    into the per-output format and gives the same uncertainties."""
    from helpers import small_model

    model = small_model([1, 6, 8])
    width = 5
    generator = torch.Generator().manual_seed(2)
    features = torch.randn((7, width), generator=generator, dtype=torch.float64)
    covariance = features.T @ features + torch.eye(width, dtype=torch.float64)
    factor = torch.linalg.cholesky(covariance)
    old = {
        **model.state_dict(),
        "llpr_covariance": covariance,
        "llpr_cholesky": factor,
        "llpr_multiplier": torch.tensor(0.5, dtype=torch.float64),
    }
    loaded = small_model([1, 6, 8], seed=1)
    loaded.load_state_dict(old)
    assert loaded.uncertainty_outputs() == ["energy"]
    expected = 0.5 * torch.sqrt(
        torch.einsum("nf,fg,ng->n", features, torch.linalg.inv(covariance), features)
    )
    torch.testing.assert_close(loaded.uncertainties(features), expected, rtol=1e-12, atol=0)
    # and the new format round-trips; a state without LLPR clears it
    again = small_model([1, 6, 8], seed=2)
    again.load_state_dict(loaded.state_dict())
    torch.testing.assert_close(again.uncertainties(features), expected, rtol=1e-12, atol=0)
    again.load_state_dict(model.state_dict())
    assert not again.has_uncertainty() and "llpr_widths" not in again.state_dict()
