"""The learning curves of a run (learning_curves.png) from its train.csv. Rank 0 draws
them in a process of its own while the run finishes (evaluation and export):

    python -m atomtrain.training.curves train.csv learning_curves.png

so that matplotlib's import and drawing (0.9 s) overlap the export (1.0 s) on a
machine with a free core (docs/performance-notes.md, "Short runs")."""

from __future__ import annotations

import csv
import logging
import math
import subprocess
import sys
from pathlib import Path

from .outputs import LOGGER_NAME, without_unit

logger = logging.getLogger(LOGGER_NAME)

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


class CurvesInBackground:
    """The learning curves drawn by a child process; ``wait`` reports how it went."""

    TIMEOUT = 300.0  # seconds: a wedged plot must not keep a finished run alive

    def __init__(self, csv_path: Path, png_path: Path):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "atomtrain.training.curves", str(csv_path), str(png_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait(self) -> None:
        try:
            _, errors = self.process.communicate(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            logger.warning(f"the learning curves were not drawn within {self.TIMEOUT:g} s")
            return
        if self.process.returncode != 0:
            last = (errors or "").strip().splitlines()[-1:] or ["no message"]
            logger.warning(f"the learning curves were not drawn: {last[0]}")


if __name__ == "__main__":
    plot_learning_curves(Path(sys.argv[1]), Path(sys.argv[2]))
