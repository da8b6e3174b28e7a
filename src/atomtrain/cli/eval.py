"""``atomtrain eval model.pt DATA``: metrics and predictions of an exported model (or
of a checkpoint's best model). The arguments and the data description are checked
before torch and the evaluation are imported (cli/eval_run.py), so that a mistake in
them is said at once."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from ..errors import OptionsError
from ..io import check_output_path
from ..options import DatasetOptions
from ..runtime import runs_one_command
from ..training.figures import start_early
from ..training.outputs import setup_logging


def run(arguments: argparse.Namespace) -> int:
    setup_logging(0, None)
    if arguments.batch_size < 1:
        raise OptionsError(f"-b {arguments.batch_size}: the batch size must be at least 1")
    check_output_path(arguments.output)
    descriptions = dataset_options(arguments.data)
    if runs_one_command():
        start_early()  # the parity plot's process: matplotlib's import alongside torch's
    from . import eval_run  # torch and the model

    return eval_run.run(arguments, descriptions)


def dataset_options(path: Path) -> list[DatasetOptions]:
    if path.suffix.lower() not in (".yaml", ".yml"):
        return [DatasetOptions.model_validate({"systems": str(path)})]
    if not path.exists():
        raise OptionsError(f"{path}: data description file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise OptionsError(f"{path}: YAML syntax error: {error}") from error
    if isinstance(data, dict) and {"training_set", "architecture"} & set(data):
        raise OptionsError(training_options_given(path, data))
    from ..options import parse_options

    options = parse_options(
        {"training_set": data}, str(path), path.parent.resolve(), within="training_set"
    )
    return options.training_set


def training_options_given(path: Path, data: dict) -> str:
    """What to say when eval is given a training options file instead of data."""
    section = data.get("test_set") if isinstance(data.get("test_set"), (list, dict, str)) else None
    section = section or data.get("training_set")
    first = section[0] if isinstance(section, list) and section else section
    systems = first.get("systems") if isinstance(first, dict) else first
    read_from = systems.get("read_from") if isinstance(systems, dict) else systems
    example = f" (e.g. {read_from})" if isinstance(read_from, str) else ""
    return (
        f"{path} is a training options file, not a data description; give eval a data "
        f"file{example}, or a YAML file holding one data section as training_set holds "
        "it (systems: ..., targets: ...)"
    )
