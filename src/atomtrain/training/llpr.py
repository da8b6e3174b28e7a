"""The energy's uncertainty by LLPR (last-layer prediction rigidity, Bigi et al., Mach.
Learn.: Sci. Technol. 2024), computed once after training.

A structure's energy is linear in the parameters of the model's last layers, with the
structure's last-layer features ``f`` (the sum of its atoms') as inputs. Its
uncertainty is ``multiplier * sqrt(f^T (C + r I)^-1 f)``, where:

* ``C`` is the sum over the training structures of ``(f/n)(f/n)^T`` (``n``: atoms; the
  loss's energy is per atom, as in metatrain). It is a sum: every process adds its
  share, and one all-reduce gives every number of processes the same matrix, to the
  rounding of the sum's order.
* ``r`` is the smallest regulariser (relative to C's mean diagonal, from 1e-12 up by
  tens; 1e-9 for a float32 model) that makes C + r I positive definite, as metatrain
  chooses it (from 1e-20, absolute). A larger one would fit in-distribution validation
  errors as well or better, but loses what LLPR is for: measured on silicon trained on
  bulk structures, surfaces had 6x the bulk's uncertainty at r = 1e-12 and less than
  the bulk's at 1.
* The multiplier is fitted on the validation set, by the Gaussian likelihood of its
  energy errors: sqrt(mean(error^2 / u^2)) (``u``: the uncalibrated uncertainty), from
  sums and a count over every process's share.

The model keeps C, the Cholesky factor of C + r I and the multiplier as buffers, so the
exported model computes uncertainties per structure and per atom (an atom's from its own
features).
"""

from __future__ import annotations

import math

import torch

from ..data.batch import Batch
from ..data.frames import FrameSet
from ..distributed import Context
from ..errors import AtomtrainError
from ..models.energy_model import EnergyModel
from .baseline import local_share
from .evaluation import local_batches

# regularisers tried, times C's mean diagonal, from the smallest a model's precision
# allows: rounding of relative size eps in the features adds about eps^2 x width / r to
# an uncertainty^2, relative, so a float32 model starts at 1e-9 (measured: the engine's
# and eval's rounding gave uncertainties 7e-6 apart at 1e-12, float32)
SMALLEST_REGULARIZER = {torch.float64: -12, torch.float32: -9}
LARGEST_REGULARIZER = 2


def atomic_last_layer(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each atom's energy [n_atoms] and last-layer features [n_atoms, width], in
    float64, without a graph."""
    with torch.no_grad():
        vectors, half = model.edge_geometry(
            batch.positions,
            batch.cell,
            batch.system_index,
            batch.pair_first,
            batch.pair_second,
            batch.cell_shifts,
        )
        return model.energies_and_last_layer_features(
            vectors, batch.pair_first, batch.pair_second, batch.atomic_numbers, half > 0
        )


def structure_features(model: EnergyModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each structure's energy [n_structures] and last-layer features [n_structures,
    width], in float64, without a graph."""
    energies, features = atomic_last_layer(model, batch)
    n = batch.n_structures
    totals = energies.new_zeros(n).index_add(0, batch.system_index, energies)
    summed = features.new_zeros((n, features.shape[1])).index_add(0, batch.system_index, features)
    return totals, summed


def feature_width(model: EnergyModel, structures: FrameSet, context: Context, dtype) -> int:
    """How many last-layer features the model gives (from the first structure, on every
    rank, so that ranks without a share agree)."""
    batch = structures.batch([0], float(model.cutoff)).to(context.device, dtype)
    return int(structure_features(model, batch)[1].shape[1])


def shares(structures: FrameSet, model: EnergyModel, context: Context, batch_size: int, dtype):
    """This rank's batches of ``structures``, on its device in ``dtype``."""
    indices = local_share(structures, context).tolist()
    for _, batch in local_batches(structures, indices, batch_size, float(model.cutoff)):
        yield batch.to(context.device, dtype)


def covariance_sum(
    model: EnergyModel, training: FrameSet, context: Context, batch_size: int, dtype
) -> torch.Tensor:
    """C over the training set: every rank's share, summed over ranks."""
    width = feature_width(model, training, context, dtype)
    covariance = torch.zeros((width, width), dtype=torch.float64, device=context.device)
    for batch in shares(training, model, context, batch_size, dtype):
        _, features = structure_features(model, batch)
        per_atom = features / batch.n_atoms.to(features).unsqueeze(1)
        covariance += per_atom.T @ per_atom
    return context.all_reduce_sum(covariance)


def regularized_cholesky(covariance: torch.Tensor, relative: float) -> torch.Tensor | None:
    """The Cholesky factor of C + r I (r = ``relative`` x C's mean diagonal), None
    where C + r I is not positive definite to float64."""
    width = covariance.shape[0]
    size = float(torch.diagonal(covariance).mean()) if width else 0.0
    regularizer = relative * (size if size > 0 else 1.0)
    identity = torch.eye(width, dtype=torch.float64, device=covariance.device)
    factor, info = torch.linalg.cholesky_ex(
        0.5 * (covariance + covariance.T) + regularizer * identity
    )
    return factor if int(info) == 0 else None


def smallest_regularizer(
    covariance: torch.Tensor, dtype: torch.dtype
) -> tuple[float, torch.Tensor]:
    """The smallest power of ten from SMALLEST_REGULARIZER of the features' ``dtype`` up
    that makes C + r I positive definite to float64, and the Cholesky factor then."""
    for exponent in range(SMALLEST_REGULARIZER.get(dtype, -9), LARGEST_REGULARIZER + 1):
        relative = 10.0**exponent
        factor = regularized_cholesky(covariance, relative)
        if factor is not None:
            return relative, factor
    raise AtomtrainError(
        "LLPR: the last-layer features' covariance is not finite (a model whose features "
        "overflow); set architecture.training.uncertainty: none"
    )


def calibration_sums(
    model: EnergyModel,
    factor: torch.Tensor,
    structures: FrameSet,
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """This rank's sum of error^2/u^2 (u: the uncalibrated uncertainty) over its share of
    ``structures`` with a known energy, and their count, batch by batch."""
    sums = torch.zeros(2, dtype=torch.float64, device=context.device)
    for batch in shares(structures, model, context, batch_size, dtype):
        if batch.energy is None:
            continue
        predicted, features = structure_features(model, batch)
        errors = predicted - batch.energy.to(predicted)
        known = torch.isfinite(errors)
        solved = torch.linalg.solve_triangular(factor, features[known].T, upper=False)
        variance = (solved * solved).sum(0).clamp_min(1e-300)
        ratio = (errors[known] * errors[known] / variance).sum()
        sums += torch.stack([ratio, known.sum().to(torch.float64)])
    return sums


def fit_llpr(
    model: EnergyModel,
    training: FrameSet,
    validation: FrameSet,
    uncertainty: str,
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
) -> str | None:
    """The model's LLPR (or none, when ``uncertainty`` is "none" or it cannot be fitted);
    what the log says of it."""
    model.clear_uncertainty()
    if uncertainty == "none" or not model.learns_energy:
        return None
    if len(model.energy_names) > 1:
        # metatomic engines pick energy_uncertainty/<variant> with energy/<variant>:
        # the first energy's alone would be taken for every variant's
        return "no LLPR uncertainty: it is computed for models of one energy (no variants)"
    if not len(training):
        return None
    calibration, calibration_name = validation, "validation"
    if not len(validation):
        calibration, calibration_name = training, "training (no validation set)"
    was_training = model.training
    model.eval()
    try:
        covariance = covariance_sum(model, training, context, batch_size, dtype)
        relative, factor = smallest_regularizer(covariance, dtype)
        sums = calibration_sums(model, factor, calibration, context, batch_size, dtype)
    finally:
        model.train(was_training)
    ratio, count = context.all_reduce_sum(sums).tolist()
    if not count > 0 or not ratio > 0:
        return (
            "no LLPR uncertainty: its calibration found no structure with a known energy "
            "error (or every error zero)"
        )
    multiplier = math.sqrt(ratio / count)
    model.set_uncertainty(covariance, factor, multiplier)
    return (
        f"LLPR uncertainty: {covariance.shape[0]} last-layer features over "
        f"{len(training)} training structures; regulariser {relative:.0e} x the mean "
        f"variance, multiplier {multiplier:.4g} fitted on {int(count)} {calibration_name} "
        "structures"
    )


def predicted_uncertainties(
    model: torch.nn.Module, batch: Batch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The energy uncertainty (eV) of each structure [n_structures] and of each atom's
    energy [n_atoms] (a model with LLPR, as trained or as exported)."""
    _, per_atom = atomic_last_layer(model, batch)
    with torch.no_grad():
        per_structure = per_atom.new_zeros((batch.n_structures, per_atom.shape[1]))
        per_structure = per_structure.index_add(0, batch.system_index, per_atom)
        return model.uncertainties(per_structure), model.uncertainties(per_atom)
