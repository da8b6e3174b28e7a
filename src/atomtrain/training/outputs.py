"""Side effects of a run: directory, log, CSV, plots. Only rank 0 calls these."""

from __future__ import annotations

import csv
import datetime
import logging
import math
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


# how each RMSE curve is labelled and scaled (train.csv holds eV-based values; the log
# and the final table speak meV)
CURVE_LABELS = {
    "energy_per_atom_rmse": ("energy per atom RMSE", "meV/atom"),
    "energy_rmse": ("energy RMSE", "meV"),
    "forces_rmse": ("force RMSE", "meV/A"),
    "stress_rmse": ("stress RMSE", "meV/A^3"),
    "virial_per_atom_rmse": ("virial per atom RMSE", "meV/atom"),
}
PANELS_PER_ROW = 3


def plot_learning_curves(csv_path: Path, png_path: Path) -> None:
    """Train and validation RMSE of each target against epochs (energies, forces and
    stress in meV units, mtt:: targets in their files' units), at most three panels a
    row."""
    import matplotlib.pyplot as plt

    figure = learning_curves_figure(csv_path)
    if figure is not None:
        figure.savefig(png_path, dpi=100)
        plt.close(figure)


def label_log_axis(axis, values: list[float]) -> None:
    """Labelled ticks on a log axis however narrow its range: matplotlib labels only
    powers of ten (or a few of the ticks between), which leaves a curve within a
    decade or two with one label or none. Every integer multiple within one decade, 1,
    2 and 5 within three, powers of ten beyond."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [value for value in values if value > 0]
    if not positive:
        return
    decades = math.log10(max(positive) / min(positive))
    subs = tuple(range(1, 10)) if decades < 1 else (1, 2, 5) if decades < 3 else (1,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def learning_curves_figure(csv_path: Path):
    """The figure plot_learning_curves saves, or None for an empty table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with csv_path.open() as stream:
        rows = [
            {without_unit(key)[0]: value for key, value in row.items()}
            for row in csv.DictReader(stream)
        ]
        units = dict(without_unit(key) for key in rows[0]) if rows else {}
    if not rows:
        return None
    epochs = [int(row["epoch"]) for row in rows]
    # the whole sets' RMSE curves (not each file's share, which train.csv also holds)
    labels = dict(CURVE_LABELS)
    for column in rows[0]:  # mtt:: targets, in the units of their files
        name = column.removeprefix("train_").removeprefix("validation_")
        if name.startswith("mtt::") and name.endswith("_rmse"):
            labels[name] = (f"{name.removesuffix('_rmse')} RMSE", units.get(column, ""))
    targets = [
        target for target in labels if {f"train_{target}", f"validation_{target}"} & set(rows[0])
    ]
    count = max(len(targets), 1)
    columns = min(count, PANELS_PER_ROW)
    lines = -(-count // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(4.5 * columns, 3.5 * lines), squeeze=False)
    for axis, target in zip(axes.flat, targets):
        name, unit = labels[target]
        factor = 1e3 if target in CURVE_LABELS else 1.0  # eV to meV; mtt:: as their files
        for split in ("train", "validation"):
            column = f"{split}_{target}"
            if column in rows[0] and rows[0][column] != "":
                axis.plot(epochs, [factor * float(row[column]) for row in rows], label=split)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs
        axis.set_ylabel(f"{name} ({unit})" if unit else name)
        axis.set_yscale("log")
        label_log_axis(
            axis.yaxis, [value for line in axis.get_lines() for value in line.get_ydata()]
        )
        axis.legend()
    for axis in list(axes.flat)[len(targets) :]:
        axis.set_visible(False)
    figure.tight_layout()
    return figure
