"""Options: metatrain compatibility, overrides, and the generated reference docs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from atomtrain.errors import OptionsError
from atomtrain.models import registry
from atomtrain.models.architecture import DataFacts
from atomtrain.options import LossOptions, load_options, parse_options
from atomtrain.training.datasets import file_labels

from conftest import RESOURCES, ROOT

METATRAIN_OPTIONS = """
seed: 42
device: cpu
base_precision: 64
architecture:
  name: soap_bpnn
  model:
    soap:
      cutoff:
        radius: 4.5
        width: 0.4
      max_radial: 6
      max_angular: 4
    bpnn:
      num_hidden_layers: 3
      num_neurons_per_layer: 64
      layernorm: false
  training:
    batch_size: 16
    num_epochs: 10
    learning_rate: 0.01
    warmup_fraction: 0.05
    log_interval: 2
    checkpoint_interval: 5
    loss: mae
    scale_targets: false
    atomic_baseline: {1: -13.6}
training_set:
  systems:
    read_from: data.xyz
    length_unit: angstrom
  targets:
    energy:
      key: U0
      unit: hartree
      forces: false
validation_set: 0.1
test_set: 0.1
"""


def test_metatrain_soap_bpnn_file_runs_unchanged(tmp_path):
    path = tmp_path / "options.yaml"
    path.write_text(METATRAIN_OPTIONS)
    options = load_options(path)
    assert options.architecture.model.soap.cutoff.radius == 4.5
    assert options.architecture.model.bpnn.num_neurons_per_layer == 64
    assert options.architecture.training.loss.type == "mae"
    assert options.architecture.training.atomic_baseline == {1: -13.6}
    (training_set,) = options.training_set
    assert training_set.targets.energy.unit == "hartree"
    assert training_set.systems.read_from == str(tmp_path / "data.xyz")


def test_metatrain_atom_packing_keys_are_understood():
    training = {"batch_size": 4, "max_atoms_per_batch": 300, "min_atoms_per_batch": 50}
    options = parse_options({"training_set": "data.xyz", "architecture": {"training": training}})
    assert options.architecture.training.max_atoms_per_batch == 300
    assert options.architecture.training.min_atoms_per_batch == 50
    training["min_atoms_per_batch"] = 400
    with pytest.raises(OptionsError, match="min_atoms_per_batch .400. exceeds max_atoms_per"):
        parse_options({"training_set": "data.xyz", "architecture": {"training": training}})


def test_the_options_file_metatrain_writes_runs_unchanged(tmp_path):
    """metatrain's own options_restart.yaml: every key with its default, data sets as
    lists, targets with read_from, the per-target loss."""
    path = tmp_path / "options_restart.yaml"
    path.write_text((RESOURCES / "metatrain_options_restart.yaml").read_text())
    options = load_options(path)
    training = options.architecture.training
    assert training.loss.type == "mse"
    assert training.loss.weights.model_dump() == {"energy": 1.0, "forces": 1.0, "stress": 1.0}
    assert options.distributed.port == 39591  # from training.distributed_port
    assert training.best_model_metric == "rmse_prod"
    assert options.training_set[0].systems.read_from == str(tmp_path / "silicon_train.xyz")
    energy = options.validation_set[0].targets.energy
    assert energy.stress.read_from == str(tmp_path / "silicon_validation.xyz")
    assert (energy.stress.key, energy.virial) == ("stress", False)


def metatrain_options_with(**changes):
    data = yaml.safe_load((RESOURCES / "metatrain_options_restart.yaml").read_text())
    for dotted, value in changes.items():
        target = data
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target[int(part) if part.isdigit() else part]
        target[parts[-1]] = value
    return parse_options(data, "options.yaml")


def test_metatrain_loss_weights_and_types_are_mapped():
    loss = {
        "energy": {
            "type": "huber",
            "weight": 0.5,
            "delta": 0.1,
            "gradients": {"positions": {"type": "huber", "weight": 20.0, "delta": 0.1}},
        }
    }
    options = metatrain_options_with(architecture__training__loss=loss)
    mapped = options.architecture.training.loss
    assert (mapped.type, mapped.huber_delta) == ("huber", 0.1)
    assert mapped.weights.model_dump() == {"energy": 0.5, "forces": 20.0, "stress": 1.0}
    options = metatrain_options_with(architecture__training__loss={"energy": "mae"})
    assert options.architecture.training.loss.type == "mae"


def test_metatrains_non_conservative_targets_are_read_by_their_names():
    """metatrain's spelling (non_conservative_forces), its keys or none of them, and its
    per-target loss: the targets take metatomic's names, and units of the energy's."""
    targets = {
        "energy": {"key": "energy", "unit": "kcal/mol"},
        "non_conservative_forces": {
            "key": "forces",
            "type": {"cartesian": {"rank": 1}},
            "per_atom": True,
        },
        "non_conservative_stress": {},
    }
    loss = {"energy": "mse", "non_conservative_forces": {"weight": 3.0}}
    options = metatrain_options_with(
        training_set__0__systems__length_unit="bohr",
        training_set__0__targets=targets,
        architecture__training__loss=loss,
    )
    specs = {spec.name: spec for spec in options.training_set[0].targets.specs()}
    force, stress = specs["non_conservative_force"], specs["non_conservative_stress"]
    assert (force.key, force.per_atom, force.rank, force.unit) == (
        "forces",
        True,
        1,
        "kcal/mol/bohr",
    )
    assert (stress.key, stress.per_atom, stress.rank, stress.unit) == (
        "stress",
        False,
        2,
        "kcal/mol/bohr^3",
    )
    assert stress.symmetric and stress.per_volume and not force.per_volume
    assert options.architecture.training.loss.target_weight("non_conservative_force") == 3.0
    # atomtrain's own keys take the old name too
    own = LossOptions.model_validate(
        {
            "target_weights": {"non_conservative_forces": 2.0},
            "target_types": {"non_conservative_forces": "mae"},
        }
    )
    assert own.target_weight("non_conservative_force") == 2.0
    assert own.target_loss("non_conservative_force")[0] == "mae"


@pytest.mark.parametrize(
    "dotted, value, message",
    [
        (
            "training_set__0__targets",
            {"non_conservative_forces": {"per_atom": False}},
            "non_conservative_force: it is a vector per atom",
        ),
        (
            "training_set__0__targets",
            {"non_conservative_stress": {"num_subtargets": 2}},
            "non_conservative_stress: it is a 3x3 matrix per structure",
        ),
        ("architecture__model__zbl", True, "the ZBL baseline is not implemented"),
        ("architecture__model__legacy", False, "only the legacy SOAP-BPNN is implemented"),
        ("architecture__model__long_range__enable", True, "long-range interactions are not"),
        ("architecture__model__heads", {"energy": "linear"}, "per-target heads are not"),
        ("architecture__training__per_structure_targets", ["energy"], "per-structure losses"),
        ("architecture__training__fixed_scaling_weights", {"energy": 2.0}, "fixed scaling"),
        (
            "architecture__training__loss",
            {"energy": {"type": "mse", "gradients": {"positions": "mae"}}},
            "one loss type for the energy, forces and stress, got ['mae', 'mse']",
        ),
        (
            "architecture__training__loss",
            {"energy": {"reduction": "sum"}},
            "only the 'mean' reduction is implemented",
        ),
        (
            "architecture__training__loss",
            {"energy": {}, "dipole": {}},
            "atomtrain learns 'energy', mtt::<name> targets",
        ),
        ("training_set", [], "List should have at least 1 item"),
        ("training_set__0__targets__energy__quantity", "dipole", "Input should be 'energy'"),
    ],
)
def test_metatrain_features_atomtrain_lacks_are_refused_by_name(dotted, value, message):
    with pytest.raises(OptionsError) as error:
        metatrain_options_with(**{dotted: value})
    text = str(error.value)
    assert text.startswith("options.yaml: invalid value for '") and message in text
    assert "\n" not in text


def test_overrides_change_nested_values(tmp_path):
    path = tmp_path / "options.yaml"
    path.write_text(METATRAIN_OPTIONS)
    options = load_options(
        path, ["architecture.training.num_epochs=3", "seed=7", "distributed.port=29511"]
    )
    assert options.architecture.training.num_epochs == 3
    assert options.seed == 7 and options.distributed.port == 29511
    with pytest.raises(OptionsError, match="key.path=value"):
        load_options(path, ["seed"])


def test_path_shorthand_for_data_sets():
    options = parse_options({"training_set": "/data/a.xyz", "test_set": "/data/b.xyz"})
    assert [dataset.systems.read_from for dataset in options.training_set] == ["/data/a.xyz"]
    assert [dataset.systems.read_from for dataset in options.test_set] == ["/data/b.xyz"]
    assert options.validation_set == 0.1


def test_several_data_sets_per_section_each_with_its_keys_and_paths(tmp_path):
    """metatrain's list form with several entries: paths and mappings mixed, each file
    with its own keys and units, relative paths resolved against the options file."""
    options = parse_options(
        {
            "training_set": [
                "bulk.xyz",
                {"systems": "surfaces.xyz", "targets": {"energy": {"key": "E", "unit": "meV"}}},
            ],
            "validation_set": [{"systems": {"read_from": "/data/validation.xyz"}}],
        },
        base=tmp_path,
    )
    bulk, surfaces = options.training_set
    assert bulk.systems.read_from == str(tmp_path / "bulk.xyz")
    assert bulk.targets.energy.key == "energy"
    assert surfaces.systems.read_from == str(tmp_path / "surfaces.xyz")
    assert (surfaces.targets.energy.key, surfaces.targets.energy.unit) == ("E", "meV")
    assert [dataset.systems.read_from for dataset in options.validation_set] == [
        "/data/validation.xyz"
    ]


def script_output(name: str) -> str:
    """What one of scripts/ prints (the generated parts of the docs)."""
    command = [sys.executable, str(ROOT / "scripts" / name)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_docs_options_md_is_current():
    generated = script_output("options_doc.py")
    assert generated == (ROOT / "docs" / "options.md").read_text(), (
        "docs/options.md is stale: python scripts/options_doc.py > docs/options.md"
    )
    assert "batch_size" in generated and "global batch" in generated


def test_docs_architectures_table_is_the_registrys():
    generated = script_output("architectures_doc.py")
    assert generated in (ROOT / "docs" / "architectures.md").read_text(), (
        "docs/architectures.md's table is stale: python scripts/architectures_doc.py"
    )
    from atomtrain.models import registry

    assert all(f"| `{name}`" in generated for name in registry.known())


def test_every_field_is_documented():
    from pydantic import BaseModel

    from atomtrain import options as module
    from atomtrain.options_base import field_docstrings

    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel:
            for name, description in field_docstrings(value).items():
                assert description, f"{value.__name__}.{name} has no docstring"


def test_expanded_options_load_back(tmp_path):
    from atomtrain.options import expanded

    path = tmp_path / "options.yaml"
    path.write_text(METATRAIN_OPTIONS)
    options = load_options(path)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(expanded(options)))
    assert load_options(again) == options


def test_training_defaults_are_the_architectures_and_are_recorded(tmp_path):
    """metatrain's defaults: for MACE its rate, schedule and gradient clipping at 1.0,
    for SOAP-BPNN no clipping; the record holds the value used, and ``.inf`` (no
    clipping) survives the round trip through YAML."""
    from atomtrain.options import expanded

    def clipping(architecture):
        options = parse_options({"training_set": "a.xyz", "architecture": architecture})
        return options, options.architecture.training.grad_clip_norm

    options, value = clipping({"name": "experimental.mace"})
    assert value == 1.0
    training = options.architecture.training
    assert (training.learning_rate, training.lr_scheduler) == (0.01, "ReduceLROnPlateau")
    assert "learning_rate" not in training.model_fields_set  # fine-tuning's rule sees it unset
    assert clipping({"name": "soap_bpnn"})[1] is None
    assert clipping({"name": "mace", "training": {"grad_clip_norm": 10}})[1] == 10.0
    options, value = clipping({"name": "mace", "training": {"grad_clip_norm": float("inf")}})
    assert value == float("inf")
    path = tmp_path / "again.yaml"
    path.write_text(yaml.safe_dump(expanded(options)))
    assert load_options(path).architecture.training.grad_clip_norm == float("inf")
    for bad in (0, -1.0):
        with pytest.raises(OptionsError) as error:
            clipping({"name": "mace", "training": {"grad_clip_norm": bad}})
        text = str(error.value)
        assert "'architecture.training.grad_clip_norm'" in text and "\n" not in text


# every key of metatrain's experimental.mace training section with its default, as
# metatrain writes them to options_restart.yaml (metatrain 2026.4.1)
METATRAIN_MACE_TRAINING = {
    "optimizer": "adam",
    "learning_rate": 0.01,
    "weight_decay": 5e-07,
    "amsgrad": True,
    "beta": 0.9,
    "lr_scheduler": "ReduceLROnPlateau",
    "lr_scheduler_gamma": 0.9993,
    "lr_factor": 0.8,
    "lr_scheduler_patience": 50,
    "distributed_port": 39591,
    "batch_size": 16,
    "num_epochs": 1000,
    "log_interval": 1,
    "checkpoint_interval": 100,
    "scale_targets": True,
    "atomic_baseline": {},
    "fixed_scaling_weights": {},
    "per_structure_targets": [],
    "num_workers": None,
    "log_mae": True,
    "log_separate_blocks": False,
    "best_model_metric": "mae_prod",
    "grad_clip_norm": 1.0,
    "loss": "mse",
    "max_atoms_per_batch": None,
    "min_atoms_per_batch": 0,
}


def test_metatrains_mace_training_section_is_understood_whole():
    architecture = {"name": "experimental.mace", "training": METATRAIN_MACE_TRAINING}
    options = parse_options({"training_set": "a.xyz", "architecture": architecture})
    training = options.architecture.training
    assert (training.lr_scheduler, training.lr_factor, training.beta) == (
        "ReduceLROnPlateau",
        0.8,
        0.9,
    )
    bad = {**METATRAIN_MACE_TRAINING, "optimizer": "schedulefree"}
    with pytest.raises(OptionsError) as error:
        parse_options({"training_set": "a.xyz", "architecture": {**architecture, "training": bad}})
    assert "'architecture.training.optimizer'" in str(error.value)
    assert "\n" not in str(error.value)


def test_every_architectures_training_defaults_are_valid_values():
    from atomtrain.options import TrainingOptions

    for name in registry.known():
        defaults = registry.training_defaults(name)
        assert TrainingOptions.model_validate(defaults).model_dump(include=set(defaults)) == (
            defaults
        )


def test_atomic_types_are_distinct_sorted_atomic_numbers():
    options = parse_options({"training_set": "a.xyz", "architecture": {"atomic_types": [8, 1, 8]}})
    assert options.architecture.atomic_types == [1, 8]
    assert parse_options({"training_set": "a.xyz"}).architecture.atomic_types is None
    with pytest.raises(OptionsError, match="'architecture.atomic_types.0'.*greater than or eq"):
        parse_options({"training_set": "a.xyz", "architecture": {"atomic_types": [0]}})


def test_files_in_a_metrics_table_get_distinct_labels():
    assert file_labels(["/a/x.xyz", "/b/y.xyz"]) == ["x.xyz", "y.xyz"]
    assert file_labels(["/a/x.xyz", "/b/x.xyz"]) == ["/a/x.xyz", "/b/x.xyz"]
    assert file_labels(["/a/x.xyz", "/a/x.xyz"]) == ["/a/x.xyz (1)", "/a/x.xyz (2)"]


def test_the_model_section_of_a_models_hyperparameters_builds_that_model():
    """The hyperparameter record a model keeps holds its model section, which builds
    the same model again; a record of the flat form older versions wrote reads too."""
    model_section = {
        "soap": {"cutoff": {"radius": 4.0, "width": 0.3}, "max_radial": 3, "max_angular": 2},
        "bpnn": {"num_hidden_layers": 1, "num_neurons_per_layer": 16, "layernorm": False},
    }
    options = parse_options({"training_set": "a.xyz", "architecture": {"model": model_section}})
    architecture = registry.architecture(options.architecture.name)
    model = architecture.build(options.architecture.model, DataFacts([1, 8]))
    options.architecture.model = architecture.options_from(model.hypers)
    assert options.architecture.model.model_dump(include={"soap", "bpnn"}) == model_section
    assert architecture.build(options.architecture.model, DataFacts([1, 8])).hypers == model.hypers
    flat = {
        "atomic_types": [1, 8],
        "cutoff": 4.0,
        "cutoff_width": 0.3,
        "max_radial": 3,
        "max_angular": 2,
        "num_hidden_layers": 1,
        "num_neurons_per_layer": 16,
        "layernorm": False,
        "length_unit": "angstrom",
        "energy_unit": "eV",
    }
    assert registry.architecture_of(flat).model_from(flat).hypers == model.hypers
