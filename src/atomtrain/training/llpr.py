"""Uncertainties by LLPR (last-layer prediction rigidity, Bigi et al., Mach. Learn.: Sci.
Technol. 2024), computed once after training, for every energy the model learns (the
first and its variants) and every mtt:: target.

An output is linear in the parameters of the model's last layers, with an atom's
last-layer features ``f`` (per value of a vector or tensor target: components x
subtargets) as inputs, and a structure's as the sum of its atoms'; an mtt:: target's
pseudo-tensor block (a product of learnt mixtures) is linearised at the trained weights
(its features are its derivatives in them, Gauss-Newton's). Its uncertainty is
``multiplier * sqrt(f^T (C + r I)^-1 f)``, where, for each output on its own:

* ``C`` is the sum over the training samples that have the output of ``(f/n)(f/n)^T``
  (``n``: atoms, for per-structure outputs; the loss's energy is per atom, as in
  metatrain), every value a sample (subtargets pool their weights' precision). It is a
  sum: every process adds its share, and one all-reduce gives every number of processes
  the same matrices, to the rounding of the sum's order.
* ``r`` is the smallest regulariser (relative to C's mean diagonal, from 1e-12 up by
  tens; 1e-9 for a float32 model) that makes C + r I positive definite, as metatrain
  chooses it (from 1e-20, absolute). A larger one would fit in-distribution validation
  errors as well or better, but loses what LLPR is for: measured on silicon trained on
  bulk structures, surfaces had 6x the bulk's uncertainty at r = 1e-12 and less than
  the bulk's at 1.
* The multiplier, one per subtarget as metatrain's, is fitted on the validation set by
  the Gaussian likelihood of its errors: sqrt(mean(error^2 / u^2)) (``u``: the
  uncalibrated uncertainty), from sums and counts over every process's share. An output
  the validation set does not have is calibrated on the training set.

The model keeps C, the Cholesky factor of C + r I and the multipliers as buffers, so the
exported model computes uncertainties per structure and per atom (an atom's from its own
features).
"""

from __future__ import annotations

import torch

from ..data.batch import Batch
from ..data.frames import FrameSet
from ..distributed import Context
from ..errors import AtomtrainError
from ..models.energy_model import EnergyModel, over_volumes
from ..options import TrainingOptions
from .baseline import local_share
from .evaluation import local_batches, predict

# regularisers tried, times C's mean diagonal, from the smallest a model's precision
# allows: rounding of relative size eps in the features adds about eps^2 x width / r to
# an uncertainty^2, relative, so a float32 model starts at 1e-9 (measured: the engine's
# and eval's rounding gave uncertainties 7e-6 apart at 1e-12, float32)
SMALLEST_REGULARIZER = {torch.float64: -12, torch.float32: -9}
LARGEST_REGULARIZER = 2


# the widest last-layer features an output gets an uncertainty for: its covariance and
# Cholesky factor are kept in the model (4096: 2 x 134 MB in float64)
LARGEST_WIDTH = 4096


def edge_inputs(model: torch.nn.Module, batch: Batch) -> tuple:
    """What the model's per-atom entry points take for ``batch``: the pairs' vectors,
    the pairs, the atomic numbers and whether the pairs are mirrored."""
    vectors, half = model.edge_geometry(
        batch.positions,
        batch.cell,
        batch.system_index,
        batch.pair_first,
        batch.pair_second,
        batch.cell_shifts,
    )
    return vectors, batch.pair_first, batch.pair_second, batch.atomic_numbers, half > 0


def atomic_last_layer(model: torch.nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Each LLPR output's last-layer features per atom, [n_atoms, values, width] in
    float64, without a graph."""
    with torch.no_grad():
        return model.last_layer_features(*edge_inputs(model, batch))


def summed(batch: Batch, atomic: torch.Tensor) -> torch.Tensor:
    """Per-atom rows [n_atoms, ...] summed per structure, [n_structures, ...]."""
    total = atomic.new_zeros((batch.n_structures, *atomic.shape[1:]))
    return total.index_add(0, batch.system_index, atomic)


def output_samples(
    model: EnergyModel, name: str, batch: Batch, atomic: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """An output's samples in ``batch``: their last-layer features [samples, values,
    width], which of them the batch knows the output of, and whether they are
    structures (else atoms)."""
    if name in model.energy_names:
        variant = model.energy_names.index(name)
        structures = batch.n_structures
        known = torch.zeros(structures, dtype=torch.bool, device=atomic.device)
        if batch.energy is not None:
            variants = batch.energy_variant
            if variants is None:
                variants = torch.zeros(structures, dtype=torch.long, device=atomic.device)
            known = torch.isfinite(batch.energy) & (variants == variant)
        return summed(batch, atomic), known, True
    index = model.target_names.index(name)
    per_atom = model.per_atom_targets[index]
    features = atomic if per_atom else summed(batch, atomic)
    if model.per_volume_targets[index]:  # as the model's forward divides the values
        features = over_volumes(features, batch.cell, batch.periodic, batch.system_index, per_atom)
    known = torch.zeros(features.shape[0], dtype=torch.bool, device=atomic.device)
    if name in batch.targets:
        known = batch.target_masks.get(name, ~known)
    return features, known, not per_atom


def feature_widths(
    model: EnergyModel, structures: FrameSet, context: Context, dtype
) -> dict[str, int]:
    """How many last-layer features each LLPR output has (from the first structure, on
    every rank, so that ranks without a share agree)."""
    batch = structures.batch([0], float(model.cutoff)).to(context.device, dtype)
    features = atomic_last_layer(model, batch)
    return {name: int(values.shape[2]) for name, values in features.items()}


def shares(structures: FrameSet, model: EnergyModel, context: Context, batch_size: int, dtype):
    """This rank's batches of ``structures``, on its device in ``dtype``."""
    indices = local_share(structures, context).tolist()
    for _, batch in local_batches(structures, indices, batch_size, float(model.cutoff)):
        yield batch.to(context.device, dtype)


def covariance_sums(
    model: EnergyModel,
    widths: dict[str, int],
    training: FrameSet,
    context: Context,
    batch_size: int,
    dtype,
) -> dict[str, torch.Tensor]:
    """C of each output over the training set: every rank's share, summed over ranks in
    one all-reduce."""
    covariances = {
        name: torch.zeros((width, width), dtype=torch.float64, device=context.device)
        for name, width in widths.items()
    }
    for batch in shares(training, model, context, batch_size, dtype):
        atomic = atomic_last_layer(model, batch)
        for name, covariance in covariances.items():
            features, known, per_structure = output_samples(model, name, batch, atomic[name])
            features = features[known]
            if per_structure:
                features = features / batch.n_atoms[known].to(features).reshape(-1, 1, 1)
            rows = features.reshape(-1, features.shape[2])
            covariance += rows.T @ rows
    if not covariances:
        return covariances
    joined = context.all_reduce_sum(torch.cat([c.reshape(-1) for c in covariances.values()]))
    sizes = [width * width for width in widths.values()]
    return {
        name: part.reshape(widths[name], widths[name])
        for name, part in zip(covariances, joined.split(sizes))
    }


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


def raw_variances(factor: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """f^T (C + r I)^-1 f of each value's features in ``features`` [samples, values,
    width], [samples, values]."""
    rows = features.reshape(-1, features.shape[2])
    solved = torch.linalg.solve_triangular(factor, rows.T, upper=False)
    return (solved * solved).sum(0).reshape(features.shape[0], features.shape[1])


def calibration_sums(
    model: EnergyModel,
    factors: dict[str, torch.Tensor],
    structures: FrameSet,
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """This rank's sums of error^2/u^2 (u: the uncalibrated uncertainty) per subtarget
    of each output, over its share of ``structures``' known samples, and their count
    last, batch by batch."""
    subtargets = dict(zip(model.llpr_outputs, model.llpr_subtargets))
    sums = {
        name: torch.zeros(subtargets[name] + 1, dtype=torch.float64, device=context.device)
        for name in factors
    }
    for batch in shares(structures, model, context, batch_size, dtype):
        with torch.no_grad():
            predicted = predict(model, batch, forces=False, stress=False)
        atomic = atomic_last_layer(model, batch)
        for name, factor in factors.items():
            features, known, _ = output_samples(model, name, batch, atomic[name])
            reference = batch.targets.get(name)
            if name in model.energy_names:
                reference = None if batch.energy is None else batch.energy.reshape(-1, 1)
            if reference is None:
                continue
            output = predicted["energy" if name in model.energy_names else name]
            errors = output.to(torch.float64).reshape(reference.shape) - reference
            errors, features = errors[known], features[known]
            variances = raw_variances(factor, features).clamp_min(1e-300)
            each = subtargets[name]
            ratios = errors * errors / variances
            ratios = ratios.reshape(errors.shape[0], errors.shape[1] // each, each)
            count = torch.tensor([ratios.shape[0] * ratios.shape[1]]).to(ratios)
            sums[name] += torch.cat([ratios.sum((0, 1)), count])
    return sums


def reduced(context: Context, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every output's sums, summed over ranks in one all-reduce."""
    if not sums:
        return sums
    joined = context.all_reduce_sum(torch.cat(list(sums.values())))
    return dict(zip(sums, joined.split([len(part) for part in sums.values()])))


def fit_llpr(
    model: EnergyModel,
    training: FrameSet,
    validation: FrameSet,
    options: TrainingOptions,
    context: Context,
    dtype: torch.dtype,
    seed: int,
) -> str | None:
    """The model's LLPR (or none, when ``options.uncertainty`` is "none" or it cannot be
    fitted), with its ensembles when ``options.ensemble_members`` asks; what the log
    says of it."""
    model.clear_uncertainty()
    if options.uncertainty == "none" or not len(training):
        return None
    was_training = model.training
    model.eval()
    try:
        fitted, said = fitted_outputs(
            model, training, validation, context, options.batch_size, dtype
        )
    finally:
        model.train(was_training)
    ensembles = sampled_ensembles(model, fitted, options.ensemble_members, seed)
    if ensembles:
        said += f"; an ensemble of {options.ensemble_members} for {', '.join(ensembles)}"
    model.set_uncertainty(fitted, ensembles)
    return said


def sampled_ensembles(
    model: EnergyModel,
    fitted: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    members: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    """For each energy with an uncertainty, ``members`` displacements of its last-layer
    weights [width, members] drawn from N(0, a^2 (C + r I)^-1) (``a``: its multiplier),
    as metatrain samples them, then centred over the members so that the ensemble's
    mean is the model's energy (metatrain centres its ensemble's values). The same on
    every rank: the covariance is all-reduced and the generator seeded by the run."""
    if not members:
        return {}
    generator = torch.Generator().manual_seed(seed)
    ensembles = {}
    for name in model.energy_names:
        if name not in fitted:
            continue
        _, factor, multipliers = fitted[name]
        draws = torch.randn(
            (factor.shape[0], members), generator=generator, dtype=torch.float64
        ).to(factor.device)
        sampled = torch.linalg.solve_triangular(factor.T, draws, upper=True)
        sampled = sampled * multipliers.reshape(())
        ensembles[name] = sampled - sampled.mean(dim=1, keepdim=True)
    return ensembles


def fitted_outputs(
    model: EnergyModel,
    training: FrameSet,
    validation: FrameSet,
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], str]:
    """Each output's covariance, Cholesky factor and multipliers, and what the log says."""
    widths = feature_widths(model, training, context, dtype)
    notes = [
        f"{name}: {width} last-layer features, more than {LARGEST_WIDTH}"
        for name, width in widths.items()
        if width > LARGEST_WIDTH
    ]
    widths = {name: width for name, width in widths.items() if width <= LARGEST_WIDTH}
    if not widths:
        return {}, "no LLPR uncertainty for " + "; ".join(notes)
    covariances = covariance_sums(model, widths, training, context, batch_size, dtype)
    regularized = {
        name: smallest_regularizer(covariance, dtype)
        for name, covariance in covariances.items()
        if float(torch.diagonal(covariance).sum()) > 0  # an output no structure has
    }
    notes += [f"{name}: no training data" for name in covariances if name not in regularized]
    factors = {name: factor for name, (_, factor) in regularized.items()}
    on_validation = calibration_sums(model, factors, validation, context, batch_size, dtype)
    sums = reduced(context, on_validation)
    uncalibrated = {name: factor for name, factor in factors.items() if not sums[name][-1] > 0}
    if uncalibrated:  # outputs the validation set does not have
        on_training = calibration_sums(model, uncalibrated, training, context, batch_size, dtype)
        sums.update(reduced(context, on_training))
    fitted, described = {}, {}
    for name, (relative, factor) in regularized.items():
        ratios, count = sums[name][:-1], float(sums[name][-1])
        if not count > 0 or not bool((ratios > 0).all()):
            notes.append(f"{name}: its calibration found no sample with a known nonzero error")
            continue
        multipliers = torch.sqrt(ratios / count)
        fitted[name] = (covariances[name], factor, multipliers)
        shown = ", ".join(f"{float(value):.4g}" for value in multipliers[:4])
        shown += ", ..." if len(multipliers) > 4 else ""
        described[name] = (
            f"{name} ({widths[name]} last-layer features, regulariser {relative:.0e} x their "
            f"mean variance, multiplier{'s' if len(multipliers) > 1 else ''} {shown} fitted "
            f"on {int(count)} {'training' if name in uncalibrated else 'validation'} samples)"
        )
    energies = [name for name in model.energy_names if name in fitted]
    if energies and len(energies) < len(model.energy_names):
        # an engine takes energy_uncertainty's variant with the energy's: every energy
        # has one, or none does (metatomic-ase refuses the model otherwise)
        lacking = ", ".join(name for name in model.energy_names if name not in fitted)
        notes.append(f"{', '.join(energies)}: engines need every energy's, and {lacking} lack one")
        for name in energies:
            del fitted[name], described[name]
    if not described:
        return fitted, "no LLPR uncertainty for " + "; ".join(notes)
    said = f"LLPR uncertainty over {len(training)} training structures: "
    said += "; ".join(described.values())
    if not len(validation):
        said += "; no validation set: calibrated on the training set"
    if notes:
        said += "; none for " + "; ".join(notes)
    return fitted, said


def predicted_uncertainties(
    model: torch.nn.Module, batch: Batch
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each output's uncertainty of each structure [n_structures, components,
    subtargets] and of each atom's contribution [n_atoms, components, subtargets], by
    output name (a model with LLPR, as trained or as exported)."""
    atomic = atomic_last_layer(model, batch)
    results = {}
    with torch.no_grad():
        for name in model.uncertainty_outputs():
            features = atomic[name]
            results[name] = (
                model.uncertainties_of(name, summed(batch, features)),
                model.uncertainties_of(name, features),
            )
    return results
