"""The options file: pydantic models whose field docstrings are the reference docs.

A metatrain options file for ``soap_bpnn`` runs unchanged where the meaning is the
same, the fully expanded one metatrain writes included: its keys for features atomtrain
lacks are accepted at their defaults only, those about its own machinery are ignored.
Differences: ``batch_size`` and ``max_atoms_per_batch`` are global over all processes,
and the ``distributed`` section is ours.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from .errors import OptionsError
from .models import registry
from .options_base import Strict, default_only
from .targets import (
    DIRECT_DEFAULTS,
    NON_CONSERVATIVE_STRESS,
    PREFIX,
    Irrep,
    TargetSpec,
    canonical_name,
    is_direct,
    is_energy,
    is_other_target,
    unsupported_irrep,
)
from .units import unit_problem


def _data_set_list(value: Any) -> Any:
    """A data set section as a list of data sets: one path or mapping, or metatrain's list
    of them. A path stands for a data set of that file with default keys."""
    entries = value if isinstance(value, list) else [value]
    return [{"systems": entry} if isinstance(entry, str) else entry for entry in entries]


def _loss_from_metatrain(spec: dict) -> dict:
    """metatrain's per-target loss, {energy: {type, weight, reduction, gradients:
    {positions: ..., strain: ...}}}, as LossOptions' fields (one type for all)."""
    unknown = sorted(name for name in spec if name != "energy" and not is_other_target(name))
    if unknown:
        raise ValueError(
            f"losses for {unknown}: atomtrain learns 'energy', mtt::<name> targets and "
            "non_conservative_forces / non_conservative_stress"
        )
    energy = spec.get("energy", {})
    energy = {"type": energy} if isinstance(energy, str) else dict(energy)
    parts = {"energy": energy}
    for name in spec:
        if is_other_target(name):
            part = spec[name]
            parts[name] = {"type": part} if isinstance(part, str) else dict(part)
    gradient_names = {"positions": "forces", "strain": "stress"}
    for name, part in (energy.pop("gradients", None) or {}).items():
        if name not in gradient_names:
            raise ValueError(f"loss on the '{name}' gradient: only positions and strain")
        parts[gradient_names[name]] = {"type": part} if isinstance(part, str) else part
    for part in parts.values():
        if part.get("reduction", "mean") != "mean":
            raise ValueError("only the 'mean' reduction is implemented")
    energy_parts = {k: v for k, v in parts.items() if not is_other_target(k)}
    others = {k: v for k, v in parts.items() if is_other_target(k)}
    types = {part.get("type", "mse") for part in energy_parts.values()}
    if len(types) > 1:
        raise ValueError(
            f"atomtrain uses one loss type for the energy, forces and stress, got {sorted(types)}"
        )
    options: dict[str, Any] = {
        "type": types.pop(),
        "weights": {k: v.get("weight", 1.0) for k, v in energy_parts.items()},
        "target_weights": {k: v.get("weight", 1.0) for k, v in others.items()},
        "target_types": {k: v["type"] for k, v in others.items() if "type" in v},
        "target_deltas": {k: v["delta"] for k, v in others.items() if "delta" in v},
    }
    deltas = {part["delta"] for part in energy_parts.values() if "delta" in part}
    if len(deltas) > 1:
        raise ValueError(
            "atomtrain uses one Huber delta for the energy, forces and stress, got "
            f"{sorted(deltas)}"
        )
    if deltas:
        options["huber_delta"] = deltas.pop()
    return options


class LossWeights(Strict):
    energy: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the per-atom energy loss."""
    forces: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the force loss (per force component)."""
    stress: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the stress loss (per stress component). The loss is taken on the virial
    per atom, stress times volume over the number of atoms (eV/atom), so that it weighs
    like the per-atom energy whatever the cell size; metrics report the stress itself."""


class LossOptions(Strict):
    type: Literal["mse", "mae", "huber"] = "mse"
    """Loss function applied to every target."""
    weights: LossWeights = LossWeights()
    """Relative weight of each target in the total loss."""
    huber_delta: Annotated[float, Field(gt=0)] = 1.0
    """Threshold of the Huber loss, in the target's units (per atom for energy)."""
    target_weights: dict[str, Annotated[float, Field(ge=0)]] = {}
    """Weight of each mtt:: target, by name (1 for those not listed); also accepted
    inside weights. Its loss is taken on each value (component and subtarget) of each
    structure, or of each atom for a per-atom target, as in metatrain."""

    @model_validator(mode="before")
    @classmethod
    def _target_weights_in_weights(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("weights"), dict):
            weights = dict(value["weights"])
            others = {k: weights.pop(k) for k in list(weights) if is_other_target(str(k))}
            if others:
                value = {
                    **value,
                    "weights": weights,
                    "target_weights": {**value.get("target_weights", {}), **others},
                }
        return value

    target_types: dict[str, Literal["mse", "mae", "huber"]] = {}
    """The loss of each mtt:: target, by name (``type`` for those not listed); metatrain's
    per-target ``loss: {mtt::x: {type: mae}}`` sets it."""
    target_deltas: dict[str, Annotated[float, Field(gt=0)]] = {}
    """The Huber threshold of each mtt:: target, by name (``huber_delta`` for those not
    listed), in the target's units."""

    @field_validator("target_weights", "target_types", "target_deltas", mode="before")
    @classmethod
    def _targets_by_their_names_now(cls, value: Any) -> Any:
        """non_conservative_forces, as metatrain spells it, is non_conservative_force."""
        if isinstance(value, dict):
            return {canonical_name(str(name)): part for name, part in value.items()}
        return value

    def target_weight(self, name: str) -> float:
        return float(self.target_weights.get(name, 1.0))

    def target_loss(self, name: str) -> tuple[str, float]:
        """(loss type, Huber threshold) of an mtt:: target."""
        return self.target_types.get(name, self.type), self.target_deltas.get(
            name, self.huber_delta
        )


FINETUNE_LEARNING_RATE = 1e-4


class FinetuneConfig(Strict):
    head_modules: list[str] | None = None
    """Modules to train, as name patterns of the model's parameters (fnmatch; a module
    stands for everything under it), in atomtrain's names or metatrain's (PET's
    "node_heads"). Unset, with last_layer_modules unset: the architecture's heads and
    last layers (SOAP-BPNN: each element network's last layer; MACE: its readouts;
    PET: metatrain's node and edge heads and last layers). The heads of mtt:: targets
    and energy variants always train."""
    last_layer_modules: list[str] | None = None
    """More modules to train, as head_modules (metatrain keeps the two apart)."""
    rank: Annotated[int, Field(ge=1)] = 4
    """lora: the adapters' rank."""
    alpha: Annotated[float, Field(gt=0)] = 8.0
    """lora: the adapters' scale is alpha / rank (metatrain's default alpha: 8)."""
    target_modules: list[str] | None = None
    """lora: the linear maps to adapt, as patterns of their names or of the last part
    of them (metatrain's). Unset: SOAP-BPNN's every linear map, PET's attention input
    and output maps (input_linear, output_linear: metatrain's default); MACE's adapters
    (mace-torch's own) go on every linear map."""


FINETUNE_CONFIG_KEYS = {
    "heads": {"head_modules", "last_layer_modules"},
    "lora": {"rank", "alpha", "target_modules"},
}


class FinetuneOptions(Strict):
    read_from: str
    """Checkpoint (.ckpt) of an atomtrain training, whose best model training starts
    from, or a model exported by atomtrain (model.pt); relative paths are relative to the
    options file."""
    method: Literal["full", "heads", "lora"] = "full"
    """Which parameters are trained (metatrain's names): "full", all of them; "heads",
    only the heads and last layers (config's head_modules, last_layer_modules); "lora",
    only low-rank adapters on the linear maps (config's rank, alpha, target_modules),
    merged into the exported model. Every other parameter stays bitwise as the
    pretrained model has it."""
    config: FinetuneConfig = FinetuneConfig()
    """What the heads and lora methods train (metatrain's keys)."""
    inherit_heads: dict[str, str] = {}
    """Heads this run adds that start from one of the pretrained model's (metatrain's
    key), {new target: pretrained target}: an mtt:: target from another of the same
    type, an energy variant from another variant or from the energy, e.g.
    {energy/r2scan: energy}. A variant started from the model's first energy learns
    its difference to it (at the start both are equal); the others copy its weights.
    Targets this run names that the model lacks get new heads; the model's heads this
    run does not train are kept as they are."""


PRODUCT_METRICS = ("rmse_prod", "mae_prod")
"""best_model_metric's metatrain products; with "loss", the choices that name no one
error."""


def _selection_metric(value: str) -> str:
    """best_model_metric: loss, a product, or one error (``<target>_rmse`` or ``_mae``;
    a bare target name means its RMSE). Whether the run has that target is checked
    when its data is read."""
    if value in ("loss", *PRODUCT_METRICS) or value.endswith(("_rmse", "_mae")):
        return value
    if value == "energy":
        return "energy_per_atom_rmse"
    if value in ("forces", "stress", "virial", "energy_per_atom", "virial_per_atom"):
        return {"stress": "stress_rmse", "virial": "virial_per_atom_rmse"}.get(
            value, f"{value}_rmse"
        )
    if is_other_target(value):
        return f"{canonical_name(value)}_rmse"
    raise ValueError(
        f"'{value}' is not a validation error: give loss, rmse_prod, mae_prod, or one "
        "error such as forces_rmse, energy_per_atom_mae or mtt::dipole_rmse"
    )


class TrainingOptions(Strict):
    batch_size: Annotated[int, Field(ge=1)] = 8
    """Structures per optimisation step, summed over all processes (the global batch;
    metatrain's batch_size is per GPU instead). Unused for training when
    max_atoms_per_batch is set."""
    max_atoms_per_batch: Annotated[int, Field(ge=1)] | None = None
    """Pack the global batches by atom count instead of taking batch_size structures:
    structures, in an order shuffled once with the seed, go into a batch until the next
    would take it past this many atoms (all processes together; metatrain's limit is
    per GPU). The batches are packed once and shuffled as wholes every epoch, as
    metatrain does; a structure larger than the limit is a batch of its own. Validation
    and test structures are then evaluated in batches of at most this many atoms per
    process."""
    min_atoms_per_batch: Annotated[int, Field(ge=0)] = 0
    """With max_atoms_per_batch: packed batches holding fewer atoms than this are left
    out of training, with their structures, for the whole run."""
    num_epochs: Annotated[int, Field(ge=1)] = 100
    """Passes over the training set."""
    learning_rate: Annotated[float, Field(gt=0)] = 0.001
    """Peak learning rate of Adam, reached after the warmup (MACE's default: 0.01, see
    its table). Left unset when fine-tuning, it is 1e-4 instead: on ethanol it kept a
    pretrained model's quality on held-out data, where 1e-3 made it worse
    (docs/performance-notes.md, "Fine-tuning")."""
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.01
    """Fraction of all steps over which the learning rate rises linearly from zero;
    afterwards it follows lr_scheduler (MACE's default: 0, no warmup)."""
    lr_scheduler: Literal["cosine", "constant", "ExponentialLR", "ReduceLROnPlateau"] = "cosine"
    """The learning rate after the warmup: "cosine", a cosine decay to zero at the last
    step; "constant", learning_rate throughout; "ExponentialLR", multiplied by
    lr_scheduler_gamma every epoch; "ReduceLROnPlateau", multiplied by lr_factor when
    the validation error that picks the best model (best_model_metric) has not improved
    for more than lr_scheduler_patience validations (MACE's default, mace_run_train's
    and metatrain's; over a short run it stays constant: on ethanol MACE the constant rate
    gave 13 and 33 meV/atom where the cosine gave 75 and 64 after 6 epochs,
    docs/performance-notes.md)."""
    lr_factor: Annotated[float, Field(gt=0, lt=1)] = 0.8
    """ReduceLROnPlateau: what the learning rate is multiplied by on a plateau."""
    lr_scheduler_patience: Annotated[int, Field(ge=0)] = 50
    """ReduceLROnPlateau: validations without improvement (relative, 1e-4) tolerated
    before the rate is lowered; validations come every log_interval epochs."""
    lr_scheduler_gamma: Annotated[float, Field(gt=0, le=1)] = 0.9993
    """ExponentialLR: what the learning rate is multiplied by every epoch."""
    optimizer: Literal["adam", "adamw"] = "adam"
    """"adam" (weight_decay added to the gradients) or "adamw" (weight decay applied to
    the weights, decoupled from the gradients); metatrain's MACE key, whose
    "schedulefree" is not available."""
    beta: Annotated[float, Field(ge=0, lt=1)] = 0.9
    """Adam's first-moment decay (beta1; beta2 is 0.999), metatrain's MACE key."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """L2 penalty on the parameters, added by Adam to their gradients (MACE's default:
    5e-7, mace_run_train's and metatrain's)."""
    amsgrad: bool = False
    """Adam's AMSGrad variant (MACE's default: true, mace_run_train's and metatrain's)."""
    ema_decay: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Keep an exponential moving average of the weights, with this decay per step
    (mace_run_train's --ema_decay, 0.99 there, with its warm-up: the decay of step n is
    at most (1 + n) / (10 + n)); validation, the best model and the export use the
    average, and training continues from the weights themselves. Unset: 0.99 for MACE
    (measured: lower held-out force errors), none for SOAP-BPNN and PET; null: none."""
    grad_clip_norm: Annotated[float, Field(gt=0)] | None = None
    """Before each step, scale the gradient of the global batch (all processes together,
    so N processes still give the one-process model) down to this norm when it is larger
    (torch.nn.utils.clip_grad_norm_); unset or ``.inf``: never (MACE's default: 1.0,
    metatrain's; mace_run_train's is 10)."""
    compile: bool | Literal["auto"] = "auto"
    """Compile the training step (training/compiled.py): the forward pass with its forces
    and stress traced into one graph and compiled by inductor, for batches of every size
    (or, for a model that holds a size constant, MACE, per shape of batches padded to a
    few sizes). On a GPU, per padded batch shape, each replayed as CUDA graphs (mode
    reduce-overhead; not yet measured on a GPU). Each new graph is checked against the
    eager step on its first batch and refused when it disagrees, so the model trained is
    the eager one's to rounding. ``true``: a model that cannot be compiled is an error;
    ``false``: never; ``auto``: on CPU, for runs long enough to repay the compilation
    where docs/performance.md measured a gain (all three architectures), else eager; the
    log says which. A stop signal during a compilation gives it up: that step runs
    eagerly and the checkpoint follows it."""
    log_interval: Annotated[int, Field(ge=1)] = 1
    """Validate and log every this many epochs (and at the last one)."""
    checkpoint_interval: Annotated[int, Field(ge=1)] = 25
    """Write a numbered checkpoint every this many epochs."""
    loss: Literal["mse", "mae", "huber"] | LossOptions = LossOptions()
    """Loss type ("mse", "mae", "huber") or a mapping with type, weights, huber_delta."""
    scale_targets: bool = True
    """Scale the network output by the spread of the training energies after the
    baseline, so the networks learn numbers of order one."""
    refit_baseline: bool = True
    """After training, fit the per-element energies of the best model again by least
    squares to what its network leaves of the training energies per atom (elements fixed
    by atomic_baseline stay fixed). Forces and stress do not change; the training energy
    error per atom can only fall. A loss led by forces leaves the energies of the chosen
    epoch off by a near-constant amount (MACE on ethanol: 4 to 18 meV/atom, 2.3 to 3.9
    after the refit, docs/performance-notes.md)."""
    uncertainty: Literal["llpr", "none"] = "llpr"
    """After training, the uncertainties of the energies and of the mtt:: targets by
    LLPR (last-layer prediction rigidity, Bigi et al. 2024, as metatrain's ``llpr``):
    for each, the covariance of the features its last linear layers take, summed over
    the training set, regularised as little as the model's precision allows, and
    multipliers fitted on the validation set (Gaussian likelihood of its errors). The
    exported model then has metatomic's ``energy_uncertainty`` output (per structure
    and per atom, in eV; ``energy_uncertainty/<variant>`` for variants) and
    ``mtt::aux::<name>_uncertainty`` for each mtt:: target (a pseudo-tensor block
    linearised), and ``atomtrain eval`` writes them (docs/uncertainty.md). ``none``: no
    uncertainty."""
    ensemble_members: Annotated[int, Field(ge=0)] = 0
    """With LLPR, the number of members of an ensemble of each energy's last-layer
    weights sampled from its LLPR covariance (metatrain's ``num_ensemble_members``),
    exported as metatomic's ``energy_ensemble`` output (``energy_ensemble/<variant>``
    for variants): each member's energy, centred on the model's, whose forces and
    stress come by autograd as the energy's (i-PI's metatomic driver reads it as a
    committee, with ``energy_ensemble`` and ``force_virial_ensemble``). 0: none."""
    atomic_baseline: dict[int, float] = {}
    """Fixed per-element energies in eV ({atomic number: energy}); elements not
    listed are fitted by least squares on the training set. metatrain's form keyed by
    target ({energy: {1: -13.6}}) is accepted too."""
    finetune: FinetuneOptions | None = None
    """Start from a trained model instead of random weights: its architecture (model
    section and atomic_types, recorded in this run's options.yaml), weights, per-element
    baseline and scale; the optimizer and learning-rate schedule start anew on this
    run's data. Model keys set here must agree with the checkpoint's."""
    best_model_metric: Annotated[str, AfterValidator(_selection_metric)] = "loss"
    """How the best model (model.pt, best.ckpt) is picked from the validation errors:
    "loss", the errors weighed as the loss weighs them (stress as a virial per atom;
    each mtt:: target by its own loss type); "rmse_prod" or "mae_prod", the product of
    the RMSEs (MAEs) of energy per atom, forces, virial per atom and every mtt::
    target, metatrain's choice (its default is rmse_prod); or one validation error of
    train.csv, e.g. "forces_rmse", "energy_per_atom_mae", "mtt::dipole_rmse" (a target's
    name alone, e.g. "mtt::dipole" or "forces", means its RMSE; "energy" the energy per
    atom's)."""
    distributed: bool | None = None
    """metatrain's switch for distributed training: atomtrain finds out how it was
    launched, so the key is accepted and ignored."""
    distributed_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """metatrain's port for distributed training: used as distributed.port when that is
    unset."""
    num_workers: Annotated[int, Field(ge=0)] | None = None
    """Threads that build the next training batches (neighbor lists, copies out of the
    data arrays) while a step runs. Unset: none on a CPU, where the builder competes with
    the step for the same cores (measured on ethanol, two cores: 2.1 s an epoch with one
    worker against 1.0 s without; docs/performance-notes.md "Large data sets"), one on a GPU.
    metatrain's key of the same name counts loader processes."""
    log_mae: bool = False
    """metatrain's: atomtrain logs MAEs beside RMSEs (train.csv) anyway."""
    log_separate_blocks: bool = False
    """metatrain's per-block errors: energies have one block; accepted and ignored."""
    per_structure_targets: list[str] = []
    """metatrain's per-structure losses: not implemented (the energy loss is per atom),
    accepted when empty."""
    fixed_scaling_weights: dict[str, Any] = {}
    """metatrain's fixed target scales: not implemented, accepted when empty (see
    scale_targets)."""

    @field_validator("atomic_baseline", mode="before")
    @classmethod
    def _baseline_by_target(cls, value: Any) -> Any:
        if isinstance(value, dict) and "energy" in value:
            energy = value["energy"]
            if not isinstance(energy, dict):
                raise ValueError(
                    "a single baseline for all elements is not supported; give "
                    "{atomic number: energy}"
                )
            return energy
        return value

    @field_validator("loss", mode="before")
    @classmethod
    def _metatrain_loss(cls, value: Any) -> Any:
        if isinstance(value, dict) and (
            "energy" in value or any(is_other_target(str(k)) for k in value)
        ):
            return _loss_from_metatrain(value)
        return value

    @field_validator("loss", mode="after")
    @classmethod
    def _loss_as_options(cls, value: Any) -> LossOptions:
        return LossOptions(type=value) if isinstance(value, str) else value

    _lacking = default_only(
        {
            "per_structure_targets": "per-structure losses are not implemented",
            "fixed_scaling_weights": "fixed scaling weights are not implemented",
        }
    )

    @model_validator(mode="after")
    def _ensemble_with_llpr(self) -> TrainingOptions:
        if self.ensemble_members and self.uncertainty == "none":
            raise ValueError(
                f"ensemble_members: {self.ensemble_members} samples LLPR's covariance: "
                "set uncertainty: llpr, or ensemble_members: 0"
            )
        return self

    @model_validator(mode="after")
    def _atoms_per_batch_in_order(self) -> TrainingOptions:
        limit = self.max_atoms_per_batch
        if limit is not None and self.min_atoms_per_batch > limit:
            raise ValueError(
                f"min_atoms_per_batch ({self.min_atoms_per_batch}) exceeds "
                f"max_atoms_per_batch ({limit}): no batch could be kept; lower it"
            )
        return self


class ArchitectureCommon(Strict):
    """What every architecture's section holds besides its ``model`` section."""

    name: str = registry.DEFAULT
    """Model architecture (metatrain's ``experimental.`` prefix is accepted)."""
    training: TrainingOptions = TrainingOptions()
    """Training hyperparameters."""
    atomic_types: list[Annotated[int, Field(ge=1, le=118)]] | None = None
    """Atomic numbers the model is built for (metatrain's key). Unset: the elements of
    the training set. Elements listed but absent from the training set get an untrained
    network and a zero energy baseline (the exported model accepts them; its predictions
    for them mean nothing until trained). Every data set must hold only listed
    elements."""

    @field_validator("atomic_types")
    @classmethod
    def _distinct_types(cls, value: list[int] | None) -> list[int] | None:
        return None if value is None else sorted(set(value))

    @field_validator("name")
    @classmethod
    def _canonical_name(cls, value: str) -> str:
        # an unknown name never gets here: the union's tag picks no section for it
        return registry.canonical_name(value)

    @model_validator(mode="after")
    def _architecture_defaults(self) -> ArchitectureCommon:
        """The training keys the file leaves unset take the architecture's defaults
        (metatrain's for it); they stay unset for rules that ask (fine-tuning's rate)."""
        defaults = registry.training_defaults(self.name)
        unset = {k: v for k, v in defaults.items() if k not in self.training.model_fields_set}
        if unset:
            self.training = TrainingOptions.model_construct(
                self.training.model_fields_set, **{**dict(self.training), **unset}
            )
        return self


def unknown_architecture(name: Any) -> str:
    return f"unknown architecture '{name}'; known architectures: {', '.join(registry.known())}"


def architecture_section(name: str) -> type[ArchitectureCommon]:
    """The ``architecture`` section of one architecture: the common keys and its own
    ``model`` section (the registry's)."""
    section = registry.model_options(name)
    return create_model(
        f"{name}_architecture",
        __base__=ArchitectureCommon,
        model=(
            section,
            Field(default_factory=section, description=f"Hyperparameters of {name}'s model."),
        ),
    )


def _architecture_name(value: Any) -> str:
    name = value.get("name", registry.DEFAULT) if isinstance(value, dict) else value.name
    return registry.canonical_name(str(name))


SECTIONS = {name: architecture_section(name) for name in registry.known()}
ArchitectureOptions: Any = Annotated[
    Union[tuple(Annotated[section, Tag(name)] for name, section in SECTIONS.items())],
    Discriminator(_architecture_name),
]


def _known_unit(kind: str) -> AfterValidator:
    """A check that a unit is a known ``kind`` unit, with the closest one named."""

    def check(value: str) -> str:
        problem = unit_problem(value, kind)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


LengthUnit = Annotated[str, _known_unit("length")]
EnergyUnit = Annotated[str, _known_unit("energy")]


class SystemsOptions(Strict):
    read_from: str
    """File with the structures: extended XYZ, or any format ASE reads with energies and
    forces (trajectory, database, VASP output, ...), told apart by ASE from its name and
    content; or a directory in metatrain's memory-mapped layout (ns.npy, na.npy, x.bin,
    a.bin, c.bin, <key>.bin), as `atomtrain convert` writes it. Relative paths are
    relative to the options file."""
    length_unit: LengthUnit = "angstrom"
    """Unit of positions and cell: angstrom, bohr or nm."""

    reader: Literal["ase"] | None = None
    """Reader library (only ASE is supported; accepted for metatrain compatibility)."""


class GradientOptions(Strict):
    key: str | None = None
    """Key under which the values are stored in the file (unset: "forces", "stress" or
    "virial")."""
    read_from: str | None = None
    """Read them from another file (not supported: must be the systems file; accepted
    for metatrain files)."""
    reader: Literal["ase"] | None = None
    """Reader library (accepted for metatrain compatibility)."""


class EnergyTargetOptions(Strict):
    key: str = "energy"
    """Key of the energy in the file (info, or ASE calculator results)."""
    unit: EnergyUnit = "eV"
    """Energy unit in the file: eV, meV, hartree, Ry, kcal/mol or kJ/mol. Forces and
    stress use this unit over the length unit."""
    forces: bool | str | GradientOptions | None = None
    """Forces: true (key "forces"), a key, false, or unset to use them when present."""
    stress: bool | str | GradientOptions | None = None
    """Stress (3x3 or Voigt 6, ASE sign): true (key "stress"), a key, false, or unset
    to use it when present."""
    virial: bool | str | GradientOptions | None = None
    """Virial (-stress times volume), used when there is no stress: true (key
    "virial"), a key, false, or unset."""
    reader: Literal["ase"] | None = None
    """Reader library (accepted for metatrain compatibility)."""
    read_from: str | None = None
    """Read targets from another file (not supported: must be the systems file)."""
    quantity: Literal["energy"] = "energy"
    """metatrain's physical quantity of the target (energy only)."""
    type: Literal["scalar"] = "scalar"
    """metatrain's target type (scalar only)."""
    sample_kind: Literal["system"] = "system"
    """metatrain's sampling of the target (one energy per structure only)."""
    per_atom: Literal[False] = False
    """metatrain's per-atom targets (not for energies)."""
    num_subtargets: Literal[1] = 1
    """metatrain's number of sub-targets (one energy)."""
    description: str = ""
    """metatrain's free-text description of the target."""

    def file_holders(self) -> list[EnergyTargetOptions | GradientOptions]:
        """This target and its gradients given as mappings: those that may name a file
        of their own (read_from)."""
        gradients = (self.forces, self.stress, self.virial)
        return [self, *(g for g in gradients if isinstance(g, GradientOptions))]


class CartesianType(Strict):
    rank: Annotated[int, Field(ge=1, le=2)]
    """Rank of the Cartesian tensor: 1 (a vector, e.g. a dipole) or 2 (a 3x3 matrix,
    e.g. a polarisability)."""


class IrrepOptions(Strict):
    o3_lambda: Annotated[int, Field(ge=0)]
    """Angular order of the block (0 to 2)."""
    o3_sigma: Literal[1, -1] = 1
    """1 for a proper tensor, -1 for a pseudotensor."""


class SphericalType(Strict):
    irreps: Annotated[list[IrrepOptions], Field(min_length=1)]
    """The blocks, in the order their values follow each other in the file."""


class TargetType(Strict):
    cartesian: CartesianType | None = None
    """A Cartesian tensor."""
    spherical: SphericalType | None = None
    """A spherical tensor: irreducible blocks of the rotation group."""

    @model_validator(mode="after")
    def _one_kind(self) -> TargetType:
        if (self.cartesian is None) == (self.spherical is None):
            raise ValueError("give one of 'scalar', {cartesian: {rank}}, {spherical: {irreps}}")
        return self


class OtherTargetOptions(Strict):
    """A target other than the energy (metatrain's ``mtt::<name>``), predicted directly
    by a head of its own on the model's per-atom features; its values are used as they
    are in the file (no unit conversion: ``unit`` is recorded in the exported model)."""

    key: str | None = None
    """Key of the values in the file: the frame's info (per structure) or its per-atom
    arrays (per atom). Unset: the target's name without ``mtt::``."""
    quantity: str = ""
    """Physical quantity (free text, as metatrain records it)."""
    unit: str = ""
    """Unit of the values, recorded in the exported model (e.g. "e*angstrom")."""
    type: Literal["scalar"] | TargetType = "scalar"
    """"scalar", {cartesian: {rank: 1 or 2}} or {spherical: {irreps: [{o3_lambda,
    o3_sigma}, ...]}}, with o3_lambda up to 2. Per structure, a vector has 3 values
    (x, y, z), a rank-2 tensor 9 (row-major), a spherical block 2*o3_lambda+1 (o3_mu
    from -o3_lambda up), each times num_subtargets."""
    per_atom: bool = False
    """One value per atom (in the frame's arrays) instead of one per structure."""
    sample_kind: Literal["system", "atom"] | None = None
    """metatrain 2026.4's spelling of per_atom: "atom" for per_atom: true."""
    num_subtargets: Annotated[int, Field(ge=1)] = 1
    """Number of properties of the target (e.g. the points of a density of states)."""
    description: str = ""
    """Free-text description, recorded in the exported model."""
    reader: Literal["ase"] | None = None
    """Reader library (accepted for metatrain compatibility)."""
    read_from: str | None = None
    """Read the target from another file (not supported: must be the systems file)."""
    forces: Literal[False] | None = None
    """metatrain's gradients of a target: not for targets other than the energy."""
    stress: Literal[False] | None = None
    """As forces."""
    virial: Literal[False] | None = None
    """As forces."""

    @model_validator(mode="after")
    def _sample_kind(self) -> OtherTargetOptions:
        if self.sample_kind is not None:
            self.per_atom = self.sample_kind == "atom"
        return self

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        known = "give 'scalar', {cartesian: {rank: 1 or 2}} or {spherical: {irreps: [...]}}"
        if isinstance(value, str) and value != "scalar":
            raise ValueError(f"unknown target type '{value}'; {known}")
        if isinstance(value, dict) and set(value) - {"cartesian", "spherical"}:
            raise ValueError(f"unknown target type {sorted(value)}; {known}")
        return value

    @field_validator("type", mode="after")
    @classmethod
    def _heads_can_make(cls, value: Any) -> Any:
        if isinstance(value, TargetType) and value.spherical is not None:
            for irrep in value.spherical.irreps:
                problem = unsupported_irrep(Irrep(irrep.o3_lambda, irrep.o3_sigma))
                if problem:
                    raise ValueError(problem)
        return value

    def spec(self, name: str) -> TargetSpec:
        kind, rank, irreps = "scalar", 0, ()
        if isinstance(self.type, TargetType):
            if self.type.cartesian is not None:
                kind, rank = "cartesian", self.type.cartesian.rank
            else:
                assert self.type.spherical is not None
                kind = "spherical"
                irreps = tuple(Irrep(i.o3_lambda, i.o3_sigma) for i in self.type.spherical.irreps)
        return TargetSpec(
            name=name,
            key=self.key or name.removeprefix(PREFIX),
            kind=kind,
            rank=rank,
            irreps=irreps,
            per_atom=self.per_atom,
            num_subtargets=self.num_subtargets,
            unit=self.unit,
            quantity=self.quantity,
            description=self.description,
        )


class TargetsOptions(Strict):
    """The targets of a data set, by metatrain's names: ``energy`` (with its forces and
    stress), any number of ``mtt::<name>`` targets, and metatrain's non-conservative
    forces and stress (``non_conservative_forces``: key "forces", a vector per atom;
    ``non_conservative_stress``: key "stress", a symmetric 3x3 matrix per structure),
    predicted directly by heads of their own and exported as metatomic's outputs of those
    names; their unit is the energy's over the length's unless given. A section that
    names other targets and no energy learns no energy."""

    energy: EnergyTargetOptions | None = EnergyTargetOptions()
    """The energy target and its derivatives."""
    energy_name: str = "energy"
    """Which energy it is: "energy", or a variant "energy/<variant>" (a level of theory,
    e.g. energy/r2scan), written as that key in the file. Each variant a run names has a
    head and per-element baseline of its own on the shared model; the exported model
    gives each as a metatomic output (``energy/<variant>``), which an engine picks
    (metatomic-ase: ``variants={"energy": "<variant>"}``)."""
    others: dict[str, OtherTargetOptions] = {}
    """The ``mtt::<name>`` and non-conservative targets (written beside energy in the
    file, not under this key)."""

    @model_validator(mode="before")
    @classmethod
    def _gather_others(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        value = dict(value)
        others = dict(value.pop("others", None) or {})
        energies = [name for name in value if isinstance(name, str) and is_energy(name)]
        if len(energies) > 1:
            raise ValueError(
                f"one energy per data set, got {energies}: give each level of theory a data "
                "set section of its own (they may name the same file)"
            )
        for name in energies:
            if name != "energy":
                if not name.removeprefix("energy/").strip():
                    raise ValueError(f"'{name}': name the variant, e.g. energy/r2scan")
                value["energy"] = value.pop(name)
                value["energy_name"] = name
        for name in [name for name in value if isinstance(name, str)]:
            if is_other_target(name):
                others[canonical_name(name)] = value.pop(name)
        for name in [name for name in others if is_direct(name)]:
            given = others[name]
            if isinstance(given, dict):  # the keys metatrain's options may leave out
                others[name] = {**DIRECT_DEFAULTS[name], **given}
            elif given is None or given is True:
                others[name] = dict(DIRECT_DEFAULTS[name])
        if others and "energy" not in value:
            value["energy"] = None
        if others:
            value["others"] = others
        return value

    @model_serializer(mode="wrap")
    def _others_beside_energy(self, handler: Any) -> dict[str, Any]:
        """Written as metatrain writes them: each mtt:: target beside the energy."""
        data = handler(self)
        name = data.pop("energy_name", "energy")
        data[name] = data.pop("energy")
        data.update(data.pop("others", {}) or {})
        return data

    @model_validator(mode="after")
    def _direct_targets_as_metatomic_defines_them(self) -> TargetsOptions:
        for name, options in self.others.items():
            if not is_direct(name):
                continue
            spec = options.spec(name)
            stress = name == NON_CONSERVATIVE_STRESS
            wanted = "a 3x3 matrix per structure" if stress else "a vector per atom"
            if (
                spec.kind != "cartesian"
                or spec.rank != (2 if stress else 1)
                or spec.per_atom == stress
                or spec.num_subtargets != 1
            ):
                raise ValueError(
                    f"{name}: it is {wanted} (type: {{cartesian: {{rank: {2 if stress else 1}}}}}, "
                    f"per_atom: {str(not stress).lower()}, num_subtargets: 1); remove the "
                    "other settings or name the target mtt::<name>"
                )
        return self

    def specs(self) -> list[TargetSpec]:
        return [options.spec(name) for name, options in self.others.items()]


class DatasetOptions(Strict):
    systems: SystemsOptions
    """Where the structures come from."""
    targets: TargetsOptions = TargetsOptions()
    """What to learn and where it is stored."""
    weight: Annotated[float, Field(ge=0)] = 1.0
    """Training sets: what this section's structures' loss terms are multiplied by
    (energy, forces, stress and mtt:: targets; errors are reported unweighted). A section
    of weight 0 is validated and tested but not trained on (its structures are left out
    of the epochs and of the per-element baselines, so the model is the one trained
    without it)."""
    weight_key: str | None = None
    """Training sets: a per-structure weight, read from each frame's info under this key
    (e.g. "weight", as mace_run_train's config_type_weights and fairchem's per-data-set
    weights give it), multiplying the section's; structures of weight 0 are not trained
    on."""
    pseudo_labels: bool = False
    """Training sets only, when fine-tuning: label this section's structures with the
    fine-tuning start's own predictions (energy, forces, and stress of periodic
    structures) before training, whatever the file holds: replay for a foundation model
    whose own training data are not at hand, so that fine-tuning keeps what it knew
    there. Give the section its own energy variant (``targets: {energy/pretrained:
    {key: energy}}``) to train it on a head of its own, as MACE's multi-head fine-tuning
    does, and a weight."""
    extra_data: dict[str, OtherTargetOptions] = {}
    """metatrain's extra data: values that are not targets, by name, with a target's
    keys (key, type, per_atom, unit, ...). Read and checked in every frame as a target
    is (a frame lacking one is named), and not trained on: metatrain's losses use extra
    data only for its masked loss types (``<target>_mask``), which atomtrain does not
    have."""
    epoch_fraction: Annotated[float, Field(ge=0)] = 1.0
    """Training sets: how often each of this section's structures is seen per epoch, on
    average: 1 once; 0.25 a quarter of them, chosen anew each epoch from the seed; 2
    twice (a share of the epoch for each section, the same for any number of
    processes). The steps per epoch follow from the sum."""

    @field_validator("systems", mode="before")
    @classmethod
    def _path_as_systems(cls, value: Any) -> Any:
        return {"read_from": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _direct_targets_in_the_file_units(self) -> DatasetOptions:
        """A non-conservative force or stress without a unit is in the section's energy
        unit over its length unit (or its cube), as its energy's forces and stress."""
        energy = self.targets.energy.unit if self.targets.energy is not None else "eV"
        length = self.systems.length_unit
        for name, options in self.targets.others.items():
            if is_direct(name) and not options.unit:
                power = "^3" if name == NON_CONSERVATIVE_STRESS else ""
                options.unit = f"{energy}/{length}{power}"
        return self


class DistributedOptions(Strict):
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """TCP port of rank 0's rendezvous. Unset: MASTER_PORT if set; under SLURM a port
    derived from the job and step ids, so two jobs on one node do not collide; else a
    free port."""
    timeout: Annotated[float, Field(gt=0)] = 300.0
    """Seconds to wait for the other processes (joining, and in each collective) before
    giving up with a message naming the missing peer."""
    check_consistency_every: Annotated[int, Field(ge=0)] = 0
    """Every this many steps, check that all processes hold identical parameters
    (0: never)."""


SurveyWarning = Literal[
    "isolated_atoms",
    "many_neighbors",
    "short_distances",
    "long_distances",
    "energy_spread",
    "force_scale",
]

SplitOrDataset = Union[
    Annotated[float, Field(ge=0, lt=1)], Annotated[list[DatasetOptions], Field(min_length=1)]
]


class LoggingOptions(Strict):
    tensorboard: bool | None = None
    """TensorBoard event files in the run directory's ``tensorboard/`` (the rows of
    train.csv, by epoch). Unset: written when the tensorboard package is installed;
    true: required (``pip install atomtrain[tensorboard]``); false: never."""
    wandb: dict[str, Any] | None = None
    """Log to Weights & Biases: the keys of ``wandb.init`` (project, entity, name,
    group, tags, notes, mode). ``mode: offline`` needs no network (``wandb sync``
    uploads later). A run resumed with --restart, requeued or not, continues the same
    W&B run. Needs ``pip install atomtrain[wandb]``."""
    figures: bool = True
    """Draw ``learning_curves.png`` from train.csv at the end of the run (a child process
    with matplotlib, about 0.8 s of CPU beside the export). false: train.csv only, for
    scans of many short runs."""


class Options(Strict):
    """Top-level options of ``atomtrain train``."""

    seed: Annotated[int, Field(ge=0)] | None = None
    """Random seed for the split, initial weights and batch order. Unset: a random
    seed, written to the log and to the expanded options so the run can be repeated."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: cuda if available when auto. With several processes on CUDA,
    each uses GPU local_rank modulo the visible GPUs."""
    base_precision: Literal[32, 64] = 32
    """Floating point precision of the model and training: 32 or 64 bits."""
    architecture: ArchitectureOptions = Field(default_factory=SECTIONS[registry.DEFAULT])
    """Model architecture and its hyperparameters."""
    training_set: Annotated[list[DatasetOptions], Field(min_length=1)]
    """Training data: a file path, a mapping with systems and targets, or a list of
    those (metatrain's form). Files may differ in keys, units and targets: forces and
    stress are learnt and reported for the structures that have them (molecules with
    energies only beside crystals with stress). Fractions for validation and test are
    cut from each file separately."""
    validation_set: SplitOrDataset = 0.1
    """Validation data: a fraction of each training file, or data sets like
    training_set."""
    test_set: SplitOrDataset = 0.0
    """Test data: a fraction of each training file, or data sets like training_set."""
    distributed: DistributedOptions = DistributedOptions()
    """Multi-process training settings (atomtrain only)."""
    final_eval: bool = True
    """metatrain's switch for the final evaluation: atomtrain always reports the best
    model's metrics on every set; accepted and ignored."""
    print_stats: bool | Literal["auto"] = "auto"
    """metatrain's data set statistics printout: accepted and ignored (the log gives the
    set sizes and targets, and the data survey)."""
    logging: LoggingOptions = LoggingOptions()
    """Experiment logs beside train.csv (rank 0 writes them)."""
    wandb: dict[str, Any] | None = None
    """metatrain's spelling of ``logging.wandb``."""
    silence_warnings: list[SurveyWarning] = []
    """Warnings of the data survey at the start of every run and ``--check``
    (docs/sanity.md) to leave out, by the name each warning ends with:
    isolated_atoms (most atoms have no neighbor within the cutoff), many_neighbors
    (more than 500 on average), short_distances, long_distances (nearest neighbors
    unlike bonded or packed matter: a length unit), energy_spread, force_scale (an
    energy unit)."""

    def data_sections(self) -> list[DatasetOptions]:
        """Every data set section: training's, and validation's and test's when given as
        data sets rather than fractions."""
        sections = [self.training_set, self.validation_set, self.test_set]
        return [dataset for section in sections if isinstance(section, list) for dataset in section]

    @field_validator("training_set", "validation_set", "test_set", mode="before")
    @classmethod
    def _as_data_set_list(cls, value: Any) -> Any:
        return value if isinstance(value, (int, float)) else _data_set_list(value)

    @model_validator(mode="after")
    def _metatrain_port(self) -> Options:
        if self.distributed.port is None:
            self.distributed.port = self.architecture.training.distributed_port
        return self

    @model_validator(mode="after")
    def _heads_config(self) -> Options:
        finetune = self.architecture.training.finetune
        if finetune is None:
            return self
        for method, keys in FINETUNE_CONFIG_KEYS.items():
            given = sorted(finetune.config.model_fields_set & keys)
            if given and finetune.method != method:
                raise ValueError(
                    f"architecture.training.finetune.config.{given[0]} is for method: "
                    f"{method}; set method: {method} or remove the key"
                )
        return self

    @model_validator(mode="after")
    def _metatrain_wandb(self) -> Options:
        if self.wandb is not None:
            if self.logging.wandb is not None:
                raise ValueError("give W&B's settings once: logging.wandb or wandb, not both")
            self.logging.wandb, self.wandb = self.wandb, None
        return self


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds, through unions, lists and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()) or ():
        found = nested_model(argument)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], location: tuple, data: dict) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at ``location``."""
    current: type[BaseModel] | None = model
    for index, part in enumerate(location):
        if isinstance(part, int):  # an entry of a list of data sets
            continue
        field = current.model_fields.get(str(part)) if current is not None else None
        if field is None:
            return None
        if index == 0 and part == "architecture":  # the section of the architecture named
            section = data.get("architecture")
            name = _architecture_name(section if isinstance(section, dict) else {})
            current = SECTIONS.get(name)
        else:
            current = nested_model(field.annotation)
    return current


def _describe(
    error: dict, source: str, data: dict, overrides: list[str] = (), within: str = ""
) -> str:
    location = tuple(part for part in error["loc"] if not (isinstance(part, str) and "[" in part))
    if location[:1] == ("architecture",) and len(location) > 1 and location[1] in SECTIONS:
        location = location[:1] + location[2:]  # the tag of the architecture's section
    if error["type"] == "union_tag_invalid":  # the section's name picked no architecture
        location = (*location, "name")
    if (
        len(location) > 1
        and isinstance(location[1], int)
        and not isinstance(data.get(str(location[0])), list)
    ):
        # a data set given alone is held as a list of one: name it as the user wrote it
        location = location[:1] + location[2:]
    # drop the names pydantic adds for union members (e.g. 'float', 'DatasetOptions')
    location = tuple(
        part for part in location if not (isinstance(part, str) and part[:1].isupper())
    )
    location = tuple(
        part
        for part in location
        if part not in ("float", "str", "bool", "int", "others")
        and not (isinstance(part, str) and "-" in part)
    )
    dotted = ".".join(str(part) for part in location)
    if within and location and location[0] == within:  # keys as the file spells them
        shown = ".".join(str(part) for part in location[1:]) or within
    else:
        shown = dotted
    for override in overrides:  # a value given on the command line: blame that
        key = override.split("=", 1)[0].strip()
        if dotted == key or dotted.startswith(key + "."):
            source = f"-r {override} (over {source})"
    if error["type"] == "extra_forbidden":
        parent = _model_at(Options, location[:-1], data)
        hint = ""
        if parent is not None:
            close = difflib.get_close_matches(str(location[-1]), parent.model_fields, n=1)
            if close:
                hint = f" (did you mean '{close[0]}'?)"
            else:
                hint = f"; known keys here: {', '.join(parent.model_fields)}"
        return f"{source}: unknown key '{shown}'{hint}"
    if error["type"] == "union_tag_invalid":
        section = data.get("architecture")
        name = section.get("name") if isinstance(section, dict) else section
        return f"{source}: invalid value for '{shown}': {unknown_architecture(name)}"
    if error["type"] == "missing":
        return f"{source}: missing required key '{shown}'"
    message = error["msg"].removeprefix("Value error, ")
    given = error.get("input")
    if isinstance(given, dict):  # a section's rule, whose message names its keys
        return f"{source}: invalid value for '{shown}': {message}"
    return f"{source}: invalid value for '{shown}': {message} (got {given!r})"


def _set_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise OptionsError(f"override '{override}' must look like key.path=value")
    dotted, raw = override.split("=", 1)
    value = yaml.safe_load(raw) if raw else None
    target = data
    parts = dotted.strip().split(".")
    for part in parts[:-1]:
        existing = target.get(part)
        if not isinstance(existing, dict):
            existing = {} if existing is None else existing
            if not isinstance(existing, dict):
                raise OptionsError(f"override '{override}': '{part}' is not a mapping")
            target[part] = existing
        target = existing
    target[parts[-1]] = value


def _resolved(path: str, base: Path) -> str:
    expanded_path = Path(path).expanduser()
    return str(expanded_path if expanded_path.is_absolute() else (base / expanded_path).resolve())


def _resolve_paths(options: Options, base: Path) -> Options:
    finetune = options.architecture.training.finetune
    if finetune is not None:
        finetune.read_from = _resolved(finetune.read_from, base)
    key = registry.start_file_key(options.architecture.name)
    if key is not None and getattr(options.architecture.model, key) is not None:
        start_file = getattr(options.architecture.model, key)
        setattr(options.architecture.model, key, _resolved(start_file, base))
    for dataset in options.data_sections():
        dataset.systems.read_from = _resolved(dataset.systems.read_from, base)
        holders = dataset.targets.energy.file_holders() if dataset.targets.energy else []
        holders += [*dataset.targets.others.values(), *dataset.extra_data.values()]
        for holder in holders:
            if holder.read_from:
                holder.read_from = _resolved(holder.read_from, base)
    return options


def parse_options(
    data: Any,
    source: str = "options",
    base: Path | None = None,
    overrides: list[str] | None = None,
    within: str = "",
) -> Options:
    """Validate a mapping as options; errors become one-line OptionsErrors, naming the
    ``-r`` override a wrong value came from. ``within``: the one key that wraps the
    user's file (an eval description is a data set section), left out of key names."""
    if not isinstance(data, dict):
        raise OptionsError(f"{source}: the options must be a YAML mapping of keys to values")
    try:
        options = Options.model_validate(data)
    except ValidationError as error:
        # of the errors of a union's members, the member that got furthest into the input
        deepest = max(error.errors(), key=lambda entry: len(entry["loc"]))
        raise OptionsError(_describe(deepest, source, data, overrides or [], within)) from error
    check_fractions(options, source)
    return _resolve_paths(options, base or Path.cwd())


def check_fractions(options: Options, source: str) -> None:
    fractions = [
        value for value in (options.validation_set, options.test_set) if isinstance(value, float)
    ]
    if sum(fractions) >= 1.0:
        raise OptionsError(
            f"{source}: validation_set and test_set fractions add up to {sum(fractions)}, "
            "leaving no training data; use fractions that sum to less than 1"
        )


def load_options(path: str | Path, overrides: list[str] | None = None) -> Options:
    """Read, override and validate an options file."""
    path = Path(path)
    if not path.exists():
        raise OptionsError(f"{path}: options file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise OptionsError(f"{path}: YAML syntax error{where}: {problem}") from error
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise OptionsError(f"{path}: the options must be a YAML mapping of keys to values")
    for override in overrides or []:
        _set_override(data, override)
    return parse_options(data, str(path), path.parent.resolve(), overrides)


def expanded(options: Options) -> dict:
    """Every option with its value, as plain data (what options.yaml of a run holds)."""
    return options.model_dump(mode="json")
