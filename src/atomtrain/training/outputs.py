"""Side effects of a run: directory, log, CSV, plots. Only rank 0 calls these."""

from __future__ import annotations

import csv
import datetime
import logging
import sys
from pathlib import Path

import numpy as np
import yaml

from ..io import atomic_write

LOGGER_NAME = "atomtrain"


def write_run_record(
    directory: Path, options: dict, split: dict[str, list[int]] | list[dict]
) -> None:
    """The fully expanded options (enough to repeat the run) and the split indices."""
    atomic_write(
        directory / "options.yaml",
        lambda stream: yaml.safe_dump(options, stream, sort_keys=False),
        binary=False,
    )
    atomic_write(
        directory / "split.yaml",
        lambda stream: stream.write(split_text(split)),
        binary=False,
    )


def split_text(split: dict[str, list[int]] | list[dict]) -> str:
    """The split as YAML, each part's indices a flow sequence on one line: PyYAML's
    emitter took 8 s (28 s profiled) for the million indices of a large data set."""

    def mapping(record: dict, indent: str) -> list[str]:
        lines = []
        for key, value in record.items():
            if isinstance(value, (list, np.ndarray)):
                text = "[" + ", ".join(map(str, np.asarray(value, dtype=np.int64).tolist())) + "]"
            else:
                text = yaml.safe_dump(value, default_style='"').strip()
            lines.append(f"{indent}{key}: {text}")
        return lines

    if isinstance(split, dict):
        return "\n".join(mapping(split, "")) + "\n"
    lines = []
    for record in split:
        entry = mapping(record, "  ")
        lines += ["- " + entry[0].lstrip(), *entry[1:]]
    return "\n".join(lines) + "\n"


def new_run_directory(root: Path) -> Path:
    """outputs/YYYY-MM-DD/HH-MM-SS, with a suffix when that name is already taken."""
    now = datetime.datetime.now()
    base = root / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    candidate = base
    suffix = 1
    while True:
        try:
            candidate.mkdir(parents=True, exist_ok=False)
            return candidate
        except FileExistsError:
            candidate = base.with_name(f"{base.name}-{suffix}")
            suffix += 1


def newest_run_directory(root: Path) -> Path | None:
    """The most recent run under ``root`` that has at least one checkpoint."""
    runs = [path.parent for path in root.glob("*/*/last.ckpt")]
    return max(runs, key=lambda path: (path / "last.ckpt").stat().st_mtime, default=None)


class RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_prefix = f"[rank {self.rank}] " if self.rank else ""
        return True


def setup_logging(rank: int, log_file: Path | None) -> logging.Logger:
    """Rank 0: INFO on the console and everything in ``log_file``. Other ranks: their
    warnings and errors on the console, prefixed with their rank."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    console = logging.StreamHandler(sys.stderr if rank else sys.stdout)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    console.addFilter(RankFilter(rank))
    console.setFormatter(logging.Formatter("%(asctime)s %(rank_prefix)s%(message)s", "%H:%M:%S"))
    logger.addHandler(console)
    if log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setLevel(logging.DEBUG)
        file_handler.addFilter(RankFilter(rank))
        file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(rank_prefix)s%(message)s")
        )
        logger.addHandler(file_handler)
    return logger


def close_logging() -> None:
    """Undo setup_logging: a process that trains in-process (a notebook, the tests) gets
    its own logging back."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)
    logger.propagate = True


def append_csv(path: Path, row: dict[str, float | int | str]) -> None:
    """One row per logged epoch; the header is written with the first row."""
    exists = path.exists()
    with path.open("a", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(row))
        if not exists:
            writer.writeheader()
        writer.writerow(row)


# the units of train.csv's metrics (eV-based; the log and the final table speak meV),
# written into its column names: "validation_forces_rmse (eV/A)"
METRIC_UNITS = {
    "energy_per_atom": "eV/atom",
    "energy": "eV",
    "forces": "eV/A",
    "stress": "eV/A^3",
    "virial_per_atom": "eV/atom",
}


def with_unit(column: str, target_units: dict[str, str]) -> str:
    """A train.csv column's name with its unit in parentheses, for RMSE and MAE columns
    (an mtt:: target's unit is its file's, from ``target_units``; none when unset)."""
    units = {**METRIC_UNITS, **target_units}
    for suffix in ("_rmse", "_mae"):
        stem = column.removesuffix(suffix)
        if stem == column:
            continue
        for name in sorted(units, key=len, reverse=True):
            if (stem == name or stem.endswith("_" + name)) and units[name]:
                return f"{column} ({units[name]})"
    return column


def without_unit(column: str) -> tuple[str, str]:
    """(name, unit) of a train.csv column written by with_unit."""
    if column.endswith(")") and " (" in column:
        name, unit = column[:-1].split(" (", 1)
        return name, unit
    return column, ""
