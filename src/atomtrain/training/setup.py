"""Setting up a run: its data, its model with the energy baseline, its batch plan.
Training and ``train --check`` both start from :func:`prepare`, so what --check reports
is what a run would do."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from ..data.columns import check_cache_setting
from ..data.frames import FrameSet
from ..data.sampler import BatchPlan, pack_once
from ..distributed import Context
from ..errors import AtomtrainError, DataError, OptionsError
from ..models import registry
from ..models.architecture import Architecture, DataFacts
from ..models.energy_model import EnergyModel
from ..models.export import output_unit_problem
from ..options import FINETUNE_LEARNING_RATE, PRODUCT_METRICS, Options, TrainingOptions
from ..targets import TargetSpec
from .baseline import (
    by_energy,
    fit_baseline,
    fit_energy_baseline,
    fit_target_baselines,
    refit_energy_baseline,
    refit_undetermined_baseline,
)
from .checkpoint import TrainingState, model_from_checkpoint
from .datasets import Datasets, file_labels, load_datasets
from .experiment_logs import check_logging
from .freezing import freeze_for_method
from .new_heads import extend_heads, heads_to_fit
from .outputs import LOGGER_NAME
from .pseudo_labels import pseudo_label
from .reports import describe_data, describe_extra_data, describe_training
from .sanity import check_training_data
from .stopping import CollectiveError
from .work import average_neighbors

T = TypeVar("T")

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class Run:
    """What the command line decided: where outputs go and what to resume from."""

    directory: Path  # chosen by rank 0, known to all ranks
    restart_state: TrainingState | None = None
    output_path: Path | None = None
    pretrained: EnergyModel | None = None  # the model to fine-tune, if any


def training_dtype(options: Options) -> torch.dtype:
    return torch.float64 if options.base_precision == 64 else torch.float32


def model_elements(options: Options, training: FrameSet) -> list[int]:
    """The elements a new model is built for: atomic_types, else the training set's."""
    return options.architecture.atomic_types or sorted(training.elements())


def data_facts(
    architecture: Architecture, options: Options, training: FrameSet, context: Context
) -> DataFacts:
    """The elements of a new model, and the mean neighbor count when its architecture
    asks for it: from every rank's share, as sums of pairs and atoms, so that it is the
    same whatever the number of processes."""
    facts = DataFacts(model_elements(options, training))
    cutoff = architecture.average_neighbors_within(options.architecture.model)
    if cutoff is not None:
        facts.average_neighbors = average_neighbors(training, cutoff, context)
        logger.info(f"{facts.average_neighbors:.3f} neighbors per atom within {cutoff:g} A")
    return facts


def batch_plan(
    training: FrameSet,
    options: TrainingOptions,
    seed: int,
    context: Context,
    shares: tuple[tuple[int, int, float], ...] = (),
) -> BatchPlan:
    """Fixed-size global batches (of each epoch's share of every training file), or
    batches packed by atom count (logged by rank 0, since how many structures a step
    holds then depends on the data)."""
    limit = options.max_atoms_per_batch
    if limit is None:
        plan = BatchPlan(len(training), options.batch_size, seed, shares=shares)
        if plan.per_epoch == 0:
            raise OptionsError(
                "training_set: the epoch_fraction of every section leaves no structure in an "
                "epoch; raise one"
            )
        if shares:
            logger.info(f"{plan.per_epoch} training structures an epoch (epoch_fraction)")
        return plan
    if shares:
        raise OptionsError(
            "training_set: epoch_fraction with architecture.training.max_atoms_per_batch is "
            "not implemented yet; use batch_size, or leave epoch_fraction at 1"
        )
    atom_counts = training.atom_counts.tolist()
    packed = pack_once(atom_counts, seed, limit, options.min_atoms_per_batch)
    if not packed:
        raise DataError(
            f"no training batch holds architecture.training.min_atoms_per_batch = "
            f"{options.min_atoms_per_batch} atoms (the training set has "
            f"{sum(atom_counts)} in all); lower min_atoms_per_batch"
        )
    kept = sum(len(batch) for batch in packed)
    average = kept / len(packed)
    notes = [f"{len(packed)} batches of at most {limit} atoms, {average:.1f} structures on average"]
    if kept < len(training):
        notes.append(f"structures left out by min_atoms_per_batch: {len(training) - kept}")
    larger = sum(1 for count in atom_counts if count > limit)
    if larger:
        notes.append(f"structures larger than the limit, each a batch of its own: {larger}")
    logger.info("training batches packed by atom count: " + "; ".join(notes))
    if average < context.world_size and context.is_main:  # the same plan on every rank
        logger.warning(
            f"packed batches hold {average:.1f} structures on average for {context.world_size} "
            "processes: some processes have nothing to do in most steps; raise "
            "architecture.training.max_atoms_per_batch"
        )
    return BatchPlan(len(training), options.batch_size, seed, packed)


def labelled_files(
    files: list[tuple[str, FrameSet]],
) -> list[tuple[str, FrameSet]]:
    """A set's non-empty shares by file, labelled for tables, when it has several files."""
    if len(files) < 2:
        return []
    labels = file_labels([path for path, _ in files])
    return [(label, structures) for label, (_, structures) in zip(labels, files) if len(structures)]


def starting_point(options: Options) -> str | None:
    """The model file a run starts from: training.finetune's, or a file of the
    architecture's own program its section names (MACE's mace_model)."""
    finetune = options.architecture.training.finetune
    if finetune is not None:
        return finetune.read_from
    return registry.start_file(options.architecture.name, options.architecture.model)


def training_targets(options: Options) -> tuple[list[TargetSpec], list[str]]:
    """The mtt:: targets the training sections name (each once, alike wherever it is
    named), and the energies they learn (every section one, or none): "energy" first
    when named, then the variants in the order the sections name them."""
    specs: dict[str, TargetSpec] = {}
    for dataset in options.training_set:
        for spec in dataset.targets.specs():
            known = specs.setdefault(spec.name, spec)
            if known.record() | {"key": ""} != spec.record() | {"key": ""}:
                raise OptionsError(
                    f"training_set: target {spec.name} is declared differently in "
                    f"{dataset.systems.read_from} (type, per_atom, num_subtargets or unit); "
                    "declare it alike in every section"
                )
    with_energy = [dataset.targets.energy is not None for dataset in options.training_set]
    if any(with_energy) and not all(with_energy):
        lacking = [
            dataset.systems.read_from
            for dataset in options.training_set
            if dataset.targets.energy is None
        ]
        raise OptionsError(
            f"training_set: {', '.join(lacking)} give(s) no energy while other sections do; "
            "atomtrain trains an energy on every section or on none yet: add the energy "
            "target there or train the energy in a run of its own"
        )
    if not any(with_energy) and not specs:
        raise OptionsError("training_set: no target to learn; give 'energy' or mtt:: targets")
    for spec in specs.values():
        problem = output_unit_problem(spec.unit) if spec.unit else None
        if problem:
            raise OptionsError(
                f"training_set: target {spec.name}: unit '{spec.unit}': {problem}; the exported "
                "model declares it to metatomic: give a unit it knows (e.g. eV/angstrom)"
            )
    names = [d.targets.energy_name for d in options.training_set if d.targets.energy is not None]
    energies = sorted(dict.fromkeys(names), key=lambda name: name != "energy")
    return list(specs.values()), energies


def fit_added_heads(
    model: EnergyModel,
    training: FrameSet,
    options: Options,
    context: Context,
    dtype: torch.dtype,
    names: set[str],
    scale_from_forces: bool,
) -> None:
    """The baselines and scales of the heads a fine-tuning run adds (``names``): an
    energy's from its structures, or, for a variant that learns its difference to the
    first energy, from what that energy leaves of them; an mtt:: target's from its
    values."""
    for position, name, structures in by_energy(training, model):
        if name not in names:
            continue
        if position > 0 and model.variant_relative[position - 1]:
            refit_energy_baseline(
                model, structures, options, context, dtype, position, name, required=True
            )
        else:
            fit_energy_baseline(
                model, structures, options, context, scale_from_forces, position, name
            )
    fit_target_baselines(model, training, context, only=names)


def assign_energy_variants(datasets: Datasets, energy_names: list[str]) -> None:
    """Tell every file's structures which of the model's energies theirs is; a file
    whose energy the model lacks is named."""
    for entries in datasets.files.values():
        for path, structures in entries:
            for frames in structures.parts:
                if frames.energy_known.any() and frames.energy_name not in energy_names:
                    raise OptionsError(
                        f"{path}: its energy is '{frames.energy_name}', which the model does "
                        f"not learn (it learns {energy_names or 'no energy'}); give one of "
                        "those, or train that energy on some training_set section"
                    )
                if frames.energy_name in energy_names:
                    frames.energy_variant = energy_names.index(frames.energy_name)


def validated_errors(validation: FrameSet) -> set[str]:
    """The errors validation reports on ``validation`` (names as in train.csv)."""
    with_forces, with_stress = validation.count_known()
    present = []
    if len(validation) and validation.gathered("energy_known").any():
        present += ["energy_per_atom", "energy"]
    present += ["forces"] * (with_forces > 0) + ["stress", "virial_per_atom"] * (with_stress > 0)
    present += [name for name in validation.target_columns() if validation.target_known(name).any()]
    return {f"{name}_{kind}" for name in present for kind in ("rmse", "mae")}


def check_selection_metric(chosen: str, available: set[str]) -> None:
    """A best_model_metric that names one error must name one validation gives."""
    if chosen in ("loss", *PRODUCT_METRICS) or chosen in available:
        return
    raise OptionsError(
        f"architecture.training.best_model_metric: this run's validation gives no "
        f"'{chosen}'; it gives {', '.join(sorted(available))}"
    )


def fresh_seed() -> int:
    """The seed of a run whose options give none (rank 0's, shared with the others)."""
    return random.SystemRandom().randrange(2**31)


@dataclass
class Prepared:
    """What a run starts from."""

    datasets: Datasets
    model: EnergyModel  # on the CPU, in the training precision, with its baseline
    plan: BatchPlan
    architecture: Architecture  # the model's, looked up once
    cutoff: float  # the model's, in angstrom
    survey_warnings: int = 0  # what the data survey warned of


def labeller(
    pretrained: EnergyModel | None, context: Context, options: Options
) -> Callable[[str, FrameSet], None] | None:
    """What labels a pseudo_labels section: the fine-tuning start (None: no start)."""
    if pretrained is None:
        return None
    batch_size = options.architecture.training.batch_size

    def label(source: str, structures: FrameSet) -> None:
        unknown = structures.elements() - set(pretrained.atomic_types)
        if unknown:
            raise DataError(
                f"{source}: atomic numbers {sorted(unknown)} are not among those the model "
                f"fine-tuned from knows ({pretrained.atomic_types}), so it cannot label "
                "them (pseudo_labels); remove those structures"
            )
        raise_together(context, None)  # meets a rank that failed on an earlier file
        pseudo_label(structures, pretrained, context, batch_size)

    return label


def raise_together(context: Context, message: str | None) -> None:
    """Every rank says whether it failed (``message``); where any did, every rank
    raises the first rank's message as one CollectiveError, printed once by rank 0."""
    if not context.is_distributed:
        return
    messages = [each for each in context.all_gather_objects(message) if each is not None]
    if messages:
        raise CollectiveError(messages[0])


def on_every_rank(context: Context, action: Callable[[], T]) -> T:
    """``action()`` on every rank, where all take part: reading the data files, checking
    them. The ranks read the same files, so a mistake in them fails every rank, each at
    its own moment: as one error, said once, they leave together instead of the
    launcher stopping the slower ranks (rank 0's run directory left behind) when the
    first exits. One process raises the error itself."""
    try:
        value = action()
    except AtomtrainError as error:
        raise_together(context, str(error))
        raise
    raise_together(context, None)
    return value


def prepare(
    options: Options,
    context: Context,
    seed: int,
    restart_state: TrainingState | None = None,
    pretrained: EnergyModel | None = None,
) -> Prepared:
    """Read the data (split with ``seed``), build the model (from a checkpoint being
    resumed, a model being fine-tuned, or anew with its fitted baseline) and deal the
    batches. Collective over ``context`` (the baseline is fitted from every rank's
    share)."""
    check_cache_setting()
    architecture = registry.architecture(options.architecture.name)
    architecture.check_section(options.architecture.model)
    check_logging(options.logging)
    specs, energy_names = training_targets(options)
    if specs and not architecture.learns_other_targets:
        raise OptionsError(
            f"architecture {options.architecture.name} cannot learn targets other than the "
            f"energy yet ({', '.join(spec.name for spec in specs)}); use soap_bpnn"
        )
    datasets = on_every_rank(
        context, lambda: load_datasets(options, seed, labeller(pretrained, context, options))
    )
    logger.info(describe_data(datasets))
    extra = describe_extra_data(options.data_sections())
    if extra:
        logger.info(extra)
    metric = options.architecture.training.best_model_metric
    on_every_rank(
        context, lambda: check_selection_metric(metric, validated_errors(datasets.validation))
    )
    training = datasets.training
    dtype = training_dtype(options)
    torch.manual_seed(seed)
    if restart_state is not None:
        if restart_state.architecture != options.architecture.name:
            raise OptionsError(
                f"the checkpoint to resume is of architecture "
                f"'{restart_state.architecture}', but the options say "
                f"'{options.architecture.name}'; resume with the options of its run"
            )
        model = model_from_checkpoint(restart_state, best=False).set_precision(dtype)
    elif pretrained is not None:
        finetune = options.architecture.training.finetune
        inherit = finetune.inherit_heads if finetune is not None else {}
        pretrained_energy = pretrained.energy_names[:1]
        added = extend_heads(pretrained, specs, energy_names, inherit)
        model = pretrained.set_precision(dtype)
        assign_energy_variants(datasets, model.energy_names)
        training_options = options.architecture.training
        method = finetune.method if finetune is not None else "full"
        logger.info(
            f"fine-tuning the best model of {starting_point(options)} (method {method}) at "
            f"learning rate {training_options.learning_rate:g} (fine-tuning's "
            f"default when unset: {FINETUNE_LEARNING_RATE:g}); its per-element energy "
            "baseline and target scale are kept"
        )
        if pretrained.reading_note:
            logger.info(pretrained.reading_note)
        if pretrained_energy and pretrained_energy[0] in energy_names:
            main = by_energy(training, model)[0][2]
            refit_undetermined_baseline(model, main, context)
        fit_added_heads(
            model,
            training,
            options,
            context,
            dtype,
            heads_to_fit(model, added, inherit),
            architecture.scale_from_forces,
        )
    else:
        facts = data_facts(architecture, options, training, context)
        model = architecture.build(options.architecture.model, facts)
        if specs or energy_names != ["energy"]:
            model.attach_targets(specs, energy_names)
        model.set_precision(dtype)
        assign_energy_variants(datasets, model.energy_names)
        fit_baseline(model, training, options, context, architecture.scale_from_forces)
        fit_target_baselines(model, training, context)
    assign_energy_variants(datasets, model.energy_names)
    freeze_for_method(model, architecture, options)
    cutoff = float(model.cutoff)
    warned = on_every_rank(
        context,
        lambda: check_training_data(
            options.training_set, datasets.files["training"], cutoff, options.silence_warnings
        ),
    )
    model.trained_on = describe_training(datasets, starting_point(options))
    plan = batch_plan(training, options.architecture.training, seed, context, datasets.shares)
    return Prepared(datasets, model, plan, architecture, cutoff, warned)
