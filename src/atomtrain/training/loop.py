"""The one training loop: set up, train, validate, checkpoint, export.

Every rank runs this function. Data order, loss normalisation and reductions are
arranged so that N processes produce the model one process would (see data/sampler.py
and training/losses.py); every control decision comes from reduced values.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import time
from typing import Any

import torch
import tqdm

from ..data.frames import FrameSet
from ..distributed import Context
from ..errors import AtomtrainError
from ..models.energy_model import EnergyModel
from ..models.export import copy_export, export
from ..options import PRODUCT_METRICS, Options, expanded
from .averaging import WeightAverage
from .baseline import refit_baseline
from .batches import StepBatches, batch_workers
from .checkpoint import TrainingState, replace_best_model, save_checkpoint
from .compiled import CompiledPredictions, step_predictions
from .datasets import Datasets
from .evaluation import metric_sums
from .experiment_logs import ExperimentLogs
from .figures import cancel_early, drawing_process
from .llpr import fit_llpr
from .losses import batch_loss
from .metrics import SUM_NAMES, MetricSums, finalize, reduce_together, resumed_sums
from .outputs import (
    LOGGER_NAME,
    append_csv,
    with_unit,
    write_run_record,
)
from .phases import start_phases
from .reports import describe, describe_model, metrics_table
from .schedule import Plateau, apply_now, make_optimizer, make_scheduler
from .setup import (
    Run,
    labelled_files,
    prepare,
    training_dtype,
)
from .stopping import NonFiniteLoss, ParametersDiverged, StopRequest, TrainingStopped
from .work import work

logger = logging.getLogger(LOGGER_NAME)


def selection_metric(
    metrics: dict[str, float], options: Options, targets: tuple[str, ...] = ()
) -> float:
    """What validation picks the best model by (``best_model_metric``): by default the
    per-target errors weighed as the loss weighs them (MAE for an MAE loss, else squared
    errors; an mtt:: target by its own loss type), stress counted as the loss counts
    it, as a virial per atom: in eV/A^3 its errors are some 400 times smaller squared,
    and the model with the best forces was chosen whatever its energies on strained
    cells (docs/performance-notes.md). Or metatrain's product of the RMSEs (MAEs) of the
    targets present, or one error the options name."""
    training = options.architecture.training
    chosen = training.best_model_metric
    names = ("energy_per_atom", "forces", "virial_per_atom", *targets)
    if chosen in PRODUCT_METRICS:
        kind = chosen.removesuffix("_prod")
        return math.prod(metrics[f"{t}_{kind}"] for t in names if f"{t}_{kind}" in metrics)
    if chosen != "loss":
        return metrics[chosen]
    loss = training.loss
    weights = loss.weights  # type: ignore[union-attr]
    kind = "mae" if loss.type == "mae" else "rmse"  # type: ignore[union-attr]
    kinds = [kind] * 3 + [
        "mae" if loss.target_loss(name)[0] == "mae" else "rmse"  # type: ignore[union-attr]
        for name in targets
    ]
    target_weights = [loss.target_weight(name) for name in targets]  # type: ignore[union-attr]
    total = 0.0
    for target, weight, kind in zip(
        names, (weights.energy, weights.forces, weights.stress, *target_weights), kinds
    ):
        value = metrics.get(f"{target}_{kind}")
        if value is not None:
            total += weight * (value if kind == "mae" else value**2)
    return total


def check_layout(state: TrainingState, model: EnergyModel) -> None:
    """The optimizer's state of a checkpoint fits only parameters of its layout."""
    saved, used = state.parameter_layout, model.parameter_layout()
    if saved != used:
        raise AtomtrainError(
            f"the checkpoint's optimizer state is for the {saved} layout of the model's "
            f"weights, this run trains in the {used} one (MACE: cuequivariance on CUDA); "
            "resume where the checkpoint was trained, or set architecture.model.cueq to match"
        )


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    try:
        optimizer.load_state_dict(state)
    except ValueError as error:  # torch: groups of other sizes
        raise AtomtrainError(
            "the checkpoint's optimizer state does not fit this run's optimizer (written "
            "by an atomtrain that grouped the parameters otherwise, e.g. before MACE's "
            "weight decay spared its embeddings and readouts); fine-tune from it instead "
            "(architecture.training.finetune.read_from)"
        ) from error


class Trainer:
    """State of one training run; ``fit`` drives it."""

    def __init__(self, options: Options, context: Context, run: Run, seed: int):
        self.started: float | None = time.perf_counter()
        self.phases = start_phases()
        self.phases.add("setup", 0.0)  # measured when the epochs begin
        self.options = options
        self.context = context
        self.run = run
        self.seed = seed
        self.training_options = options.architecture.training
        self.loss_options = self.training_options.loss
        self.dtype = training_dtype(options)
        state = run.restart_state
        prepared = prepare(options, context, seed, state, run.pretrained)
        self.datasets: Datasets = prepared.datasets
        self.model = prepared.model
        self.plan = prepared.plan
        self.cutoff = prepared.cutoff
        self.adapt_threads()  # reading may have taken long enough to tell
        training = self.datasets.training
        self.validation_files = labelled_files(self.datasets.files["validation"])
        with_forces, with_stress = training.count_known()
        self.forces, self.stress = with_forces > 0, with_stress > 0
        self.step_batches = StepBatches(
            training,
            self.cutoff,
            work(training, self.cutoff, context),
            context.rank,
            context.world_size,
            self.forces,
            self.stress,
            batch_workers(self.training_options, context.device),
            energy=self.model.learns_energy,
            widths={
                name: int(column.values.shape[1])
                for name, column in training.target_columns().items()
            },
            rotation_seed=seed if prepared.architecture.augments_rotations else None,
            specs=tuple(self.model.target_specs()),
        )
        self.targets = tuple(self.model.target_names)
        record = {**expanded(options), "seed": seed}
        if context.is_main and state is None:
            write_run_record(run.directory, record, self.datasets.split)
        self.experiment_logs = (
            ExperimentLogs(options.logging, run.directory, record) if context.is_main else None
        )
        architecture = prepared.architecture
        architecture.check_device(context.device)
        self.model.to(context.device)
        self.model.use_kernels_for(context.device)
        context.broadcast_parameters(self.model)
        remaining = self.training_options.num_epochs * self.plan.steps_per_epoch
        if state is not None:
            remaining -= state.epoch * self.plan.steps_per_epoch + state.step
        self.step_predictions = step_predictions(
            self.model,
            self.forces,
            self.stress,
            self.training_options.compile,
            architecture,
            context.device,
            remaining,
        )
        if isinstance(self.step_predictions, CompiledPredictions) and context.busy_cores:
            context.busy_cores.two_levels = True  # each thread count is a compilation
        trained = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        self.parameters = [parameter for _, parameter in trained]
        self.optimizer = make_optimizer(trained, self.training_options, architecture.decays)
        decay = self.training_options.ema_decay
        self.average = WeightAverage(self.parameters, decay) if decay is not None else None
        clip_norm = self.training_options.grad_clip_norm
        self.clip_norm = clip_norm if clip_norm is not None and math.isfinite(clip_norm) else None
        self.steps_per_epoch = self.plan.steps_per_epoch
        self.plateau = Plateau(
            self.training_options.lr_factor, self.training_options.lr_scheduler_patience
        )
        self.scheduler = make_scheduler(
            self.optimizer, self.training_options, self.steps_per_epoch, self.plateau
        )
        self.start_epoch = 0
        self.start_step = 0
        self.resumed_sums: torch.Tensor | None = None
        self.global_step = 0
        self.stop = StopRequest()
        if isinstance(self.step_predictions, CompiledPredictions):
            self.step_predictions.stop = self.stop
        self.best_metric = math.inf
        self.best_epoch = -1
        self.best_state = copy.deepcopy(self.model.state_dict())
        if state is not None:
            check_layout(state, self.model)
            load_optimizer_state(self.optimizer, state.optimizer_state)
            self.scheduler.load_state_dict(state.scheduler_state)
            if state.plateau_state is not None:
                self.plateau.load_state_dict(state.plateau_state)
            if self.average is not None and state.average_state is not None:
                self.average.load_state_dict(state.average_state)
            self.start_epoch = state.epoch
            self.start_step = state.step
            if self.start_step and context.is_main:
                assert state.epoch_sums is not None  # written with every mid-epoch step
                self.resumed_sums = resumed_sums(state.epoch_sums).to(context.device)
            self.global_step = self.start_epoch * self.steps_per_epoch + self.start_step
            self.best_metric = float(state.best_metric)
            self.best_epoch = state.best_epoch
            self.best_state = state.best_model_state or self.best_state
            where = f", step {self.start_step}" if self.start_step else ""
            epochs = self.training_options.num_epochs
            if self.start_epoch >= epochs:
                # a run stopped while finishing resumes here too: the finishing is redone
                logger.info(
                    f"the run is complete: its checkpoint is from epoch {self.start_epoch} "
                    f"of {epochs}, so nothing is trained; its best model (epoch "
                    f"{self.best_epoch}) is evaluated and exported again (raise "
                    "architecture.training.num_epochs to train further)"
                )
            else:
                logger.info(f"resuming after epoch {self.start_epoch}{where}")
        logger.info(describe_model(self.model, self.dtype))

    # one epoch ---------------------------------------------------------------------
    def train_epoch(self, epoch: int, start_step: int = 0) -> torch.Tensor:
        """One pass over the training set from global step ``start_step`` of the epoch;
        returns this rank's metric sums."""
        context = self.context
        sums = MetricSums(context.device, self.targets)
        if start_step and self.resumed_sums is not None:
            sums.values += self.resumed_sums
        batches = self.plan.batches(epoch)
        show_bar = context.is_main and sys.stderr.isatty()
        progress = tqdm.tqdm(
            total=len(batches),
            initial=start_step,
            desc=f"epoch {epoch + 1}",
            leave=False,
            disable=not show_bar,
        )
        # closed on every way out (a stop raises here), so no builder thread outlives it
        with contextlib.closing(self.step_batches.steps(batches, start_step, epoch)) as steps:
            for step, counts, batch in steps:
                batch = batch.to(context.device, self.dtype)
                predictions = self.step_predictions(batch)
                loss = batch_loss(predictions, batch, self.loss_options, counts)
                self.optimizer.zero_grad(set_to_none=True)
                # Each rank's loss is its share of the global-batch loss, so the sum of the
                # ranks' gradients is the gradient of the global batch. Gradients go to the
                # parameters only: the force loss would otherwise also be differentiated
                # with respect to the positions (second derivatives, unused).
                loss.backward(inputs=self.parameters)
                status = context.sum_gradients(self.parameters, self.step_flags(loss))
                stop, non_finite = (value > 0 for value in status.tolist())
                if non_finite:
                    raise NonFiniteLoss(
                        f"the loss became NaN or infinite at epoch {epoch + 1}, step {step + 1}; "
                        "lower architecture.training.learning_rate or look for outliers in "
                        "the data"
                    )
                if self.clip_norm is not None:
                    # the gradients are the global batch's here, the same on every rank
                    torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm)
                self.optimizer.step()
                if self.average is not None:
                    self.average.update()
                self.scheduler.step()
                self.global_step += 1
                if self.started is not None:  # what setting up cost, for large data sets
                    setup = time.perf_counter() - self.started
                    logger.info(f"first training step done {setup:.1f} s after the setup began")
                    self.started = None
                sums.accumulate(predictions, batch, loss)
                progress.update()
                self.adapt_threads()
                every = self.options.distributed.check_consistency_every
                if every and self.global_step % every == 0:
                    self.check_consistency()
                if stop:
                    progress.close()
                    self.stop_here(epoch, step + 1, sums)
        progress.close()
        return sums.values

    def adapt_threads(self) -> None:
        """Fewer threads while other processes use this rank's cores (see BusyCores)."""
        busy_cores = self.context.busy_cores
        if busy_cores is None:
            return
        step = getattr(self, "step_predictions", None)  # set after the data is read
        decision = busy_cores.poll(
            step.compilations if isinstance(step, CompiledPredictions) else 0
        )
        if decision is not None and decision.message:
            logger.warning(decision.message)

    def step_flags(self, loss: torch.Tensor) -> torch.Tensor:
        """(this rank was asked to stop, this rank's loss is not finite) as numbers; summed
        over ranks with the gradients, so that all ranks agree on them."""
        stop = torch.tensor(float(self.stop.requested), dtype=loss.dtype, device=loss.device)
        return torch.stack([stop, (~torch.isfinite(loss.detach())).to(loss.dtype)])

    def stop_here(self, epoch: int, step: int, sums: MetricSums) -> None:
        """Write a step checkpoint (rank 0) and stop every rank."""
        reduced = self.context.all_reduce_sum(sums.values.clone())
        path = self.run.directory / "last.ckpt"
        if self.context.is_main:
            save_checkpoint(path, self.checkpoint_state(epoch, step, reduced))
        self.context.barrier()
        name = self.stop.signal_name or "a signal to another rank"
        raise TrainingStopped(
            f"training stopped by {name} at epoch {epoch + 1}, step {step}; checkpoint "
            f"written to {path}. Resume with: atomtrain train OPTIONS --restart auto "
            f"(or --restart {path})"
        )

    def averaged(self) -> contextlib.AbstractContextManager:
        """The weights' moving average in the model inside the block, when one is kept."""
        return self.average.applied() if self.average is not None else contextlib.nullcontext()

    def check_consistency(self) -> None:
        check_same_parameters(self.context, self.model, self.global_step)

    def evaluate_with_shares(
        self, structures: FrameSet, shares: list[tuple[str, FrameSet]]
    ) -> list[torch.Tensor]:
        """This rank's error sums on ``structures`` and, when they come from several files,
        on each file's share (``labelled_files``): one pass, the whole being the shares
        added up."""
        if not shares:
            return [self.evaluate(structures)]
        values = [self.evaluate(share) for _, share in shares]
        return [torch.stack(values).sum(0), *values]

    def evaluate(self, structures: FrameSet) -> torch.Tensor:
        self.adapt_threads()
        return metric_sums(
            self.model,
            structures,
            self.context,
            self.training_options.batch_size,
            self.dtype,
            self.training_options.max_atoms_per_batch,
            self.targets,
        )

    def checkpoint_state(
        self, epoch: int, step: int = 0, epoch_sums: torch.Tensor | None = None
    ) -> TrainingState:
        """Everything needed to continue: ``epoch`` full epochs and ``step`` global
        steps of the next one are done; ``epoch_sums`` are that epoch's metric sums."""
        return TrainingState(
            architecture=self.model.hypers["architecture"],
            hypers=self.model.hypers,
            dtype=str(self.dtype).removeprefix("torch."),
            model_state={k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            seed=self.seed,
            best_model_state={k: v.detach().cpu() for k, v in self.best_state.items()},
            epoch=epoch,
            step=step,
            epoch_sums=None if epoch_sums is None else epoch_sums.detach().cpu(),
            optimizer_state=self.optimizer.state_dict(),
            parameter_layout=self.model.parameter_layout(),
            scheduler_state=self.scheduler.state_dict(),
            plateau_state=self.plateau.state_dict(),
            best_metric=self.best_metric,
            best_epoch=self.best_epoch,
            baseline_span=self.model.baseline_span,
            trained_on=self.model.trained_on,
            options=expanded(self.options),
            average_state=self.average.state_dict() if self.average is not None else None,
        )

    # the whole run -----------------------------------------------------------------
    def fit(self) -> dict[str, dict[str, float]]:
        self.stop.install()
        try:
            with self.context.guard():
                return self.epochs()
        finally:
            self.stop.uninstall()
            if self.experiment_logs is not None:
                self.experiment_logs.close()

    def epochs(self) -> dict[str, dict[str, float]]:
        options = self.training_options
        context = self.context
        directory = self.run.directory
        epoch_time = time.perf_counter()
        if self.started is not None:
            self.phases.add("setup", epoch_time - self.started)
        epochs_began = epoch_time
        for epoch in range(self.start_epoch, options.num_epochs):
            start_step = self.start_step if epoch == self.start_epoch else 0
            train_values = self.train_epoch(epoch, start_step)
            completed = epoch + 1
            if completed % options.log_interval == 0 or completed == options.num_epochs:
                with self.averaged():
                    validation_values = self.evaluate_with_shares(
                        self.datasets.validation, self.validation_files
                    )
                train_sums, validation_sums, *file_sums = reduce_together(
                    context, [train_values, *validation_values]
                )
                train_metrics = finalize(train_sums, self.targets)
                validation_metrics = finalize(validation_sums, self.targets)
                file_metrics = {
                    label: finalize(sums, self.targets)
                    for (label, _), sums in zip(self.validation_files, file_sums)
                }
                train_loss = float(train_sums[SUM_NAMES.index("loss")]) / self.steps_per_epoch
                chosen = validation_metrics if self.datasets.validation else train_metrics
                metric = selection_metric(chosen, self.options, self.targets)
                if options.lr_scheduler == "ReduceLROnPlateau" and self.plateau.validated(metric):
                    apply_now(self.scheduler)
                    rate = self.optimizer.param_groups[0]["lr"]
                    logger.info(f"validation error on a plateau: learning rate now {rate:.3e}")
                if metric < self.best_metric:
                    self.best_metric = metric
                    self.best_epoch = completed
                    with self.averaged():
                        self.best_state = copy.deepcopy(self.model.state_dict())
                    if context.is_main:
                        save_checkpoint(directory / "best.ckpt", self.checkpoint_state(completed))
                self.log_epoch(
                    completed,
                    train_loss,
                    train_metrics,
                    validation_metrics,
                    file_metrics,
                    time.perf_counter() - epoch_time,
                )
                epoch_time = time.perf_counter()
            if context.is_main:
                state = self.checkpoint_state(completed)
                save_checkpoint(directory / "last.ckpt", state)
                if completed % options.checkpoint_interval == 0:
                    save_checkpoint(directory / f"epoch_{completed}.ckpt", state)
        self.phases.add("epochs", time.perf_counter() - epochs_began)
        return self.finish()

    def log_epoch(
        self, epoch, train_loss, train_metrics, validation_metrics, file_metrics, seconds
    ):
        learning_rate = self.optimizer.param_groups[0]["lr"]
        logger.info(
            f"epoch {epoch}/{self.training_options.num_epochs} | lr {learning_rate:.3e} | "
            f"loss {train_loss:.4e} | train: {describe(train_metrics)} | "
            f"validation: {describe(validation_metrics)} | {seconds:.1f} s"
        )
        if self.context.is_main:
            row: dict[str, Any] = {
                "epoch": epoch,
                "learning_rate": learning_rate,
                "train_loss": train_loss,
            }
            row.update({f"train_{name}": value for name, value in train_metrics.items()})
            row.update({f"validation_{name}": value for name, value in validation_metrics.items()})
            row.update(
                (f"validation_{label}_{name}", value)
                for label, metrics in file_metrics.items()
                for name, value in metrics.items()
            )
            units = {spec.name: spec.unit for spec in self.model.target_specs()}
            row = {with_unit(name, units): value for name, value in row.items()}
            append_csv(self.run.directory / "train.csv", row)
            if self.experiment_logs is not None:
                self.experiment_logs.log(epoch, row)

    def finish(self) -> dict[str, dict[str, float]]:
        """Evaluate the best model on every set, log the table, export (the learning
        curves drawn meanwhile by a process of their own), and say where the time
        went."""
        context = self.context
        directory = self.run.directory
        self.model.load_state_dict(self.best_state)
        self.adapt_threads()
        with self.phases.timed("refit"):
            refitted = self.model.learns_energy and refit_baseline(
                self.model, self.datasets.training, self.options, context, self.dtype
            )
        with self.phases.timed("uncertainty"):
            said = fit_llpr(
                self.model,
                self.datasets.training,
                self.datasets.validation,
                self.training_options,
                context,
                self.dtype,
                self.seed,
            )
        if said is not None:
            logger.info(said)
        names: list[str] = []
        local: list[torch.Tensor] = []
        with self.phases.timed("final evaluation"):
            for label, part in (
                ("train", "training"),
                ("validation", "validation"),
                ("test", "test"),
            ):
                # each set, and each file's share of it, as metatrain reports them
                shares = labelled_files(self.datasets.files[part])
                names += [label, *(f"{label}: {name}" for name, _ in shares)]
                local += self.evaluate_with_shares(getattr(self.datasets, part), shares)
            sums = reduce_together(context, local)
        results = {name: finalize(values, self.targets) for name, values in zip(names, sums)}
        logger.info(f"best model: epoch {self.best_epoch}")
        logger.info(metrics_table(results))
        if context.is_main:
            curves = None
            if self.options.logging.figures and (directory / "train.csv").exists():
                curves = drawing_process()
                curves.draw_curves(directory / "train.csv", directory / "learning_curves.png")
            else:
                cancel_early()
            with self.phases.timed("export"):
                if refitted or self.model.has_uncertainty():
                    best = self.model.state_dict()  # once: MACE on cuequivariance converts it
                    for name in ("best.ckpt", "last.ckpt"):
                        replace_best_model(directory / name, best)
                # scripting it again for -o would take as long: the same bytes, copied
                export(self.model, directory / "model.pt")
                if self.run.output_path is not None:
                    copy_export(directory / "model.pt", self.run.output_path)
                    logger.info(f"exported model to {self.run.output_path}")
            logger.info(f"exported model to {directory / 'model.pt'}")
            if curves is not None:
                with self.phases.timed("learning curves", "waited for, drawn alongside"):
                    curves.wait("learning curves")
            logger.info(self.phases.summary())
        return results


def check_same_parameters(context: Context, model: torch.nn.Module, step: int) -> None:
    """All ranks must hold bitwise identical parameters; compare two checksums."""
    flat = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in model.parameters()])
    weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.float64) % 97 + 1
    checksum = torch.stack([flat.sum(), (flat * weights).sum()])
    spread = context.all_reduce_max(torch.cat([checksum, -checksum]))
    if not torch.equal(spread[:2], -spread[2:]):
        raise ParametersDiverged(
            f"parameters differ between ranks at step {step} (checksums range from "
            f"{float(-spread[2]):.17g} to {float(spread[0]):.17g}); this is a bug or a "
            "faulty device: please report it"
        )


def train(options: Options, context: Context, run: Run, seed: int) -> dict[str, dict[str, float]]:
    return Trainer(options, context, run, seed).fit()
