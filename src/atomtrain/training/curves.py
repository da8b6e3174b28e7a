"""The learning curves of a run (learning_curves.png) from its train.csv, drawn by a
process of its own:

    python -m atomtrain.training.curves train.csv learning_curves.png
    python -m atomtrain.training.curves --wait   # the paths come on stdin, tab-separated

A command that trains starts the second form at its start (``start_early``), so that
Python, numpy and matplotlib (0.6 s) are imported on a core the command leaves idle
while it imports torch; at the end only the drawing (0.35 s) remains, alongside the
export (docs/performance-notes.md, "Short runs")."""

from __future__ import annotations

import csv
import logging
import math
import subprocess
import sys
from pathlib import Path

from ..runtime import forget_helper, note_helper
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


class DrawingProcess:
    """A child that imports matplotlib at once, then draws the curves whose paths it is
    given. An end of its input before any path (a run that failed, drew no figures, or
    whose process died) ends it without a word."""

    TIMEOUT = 300.0  # seconds: a wedged plot must not keep a finished run alive

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "atomtrain.training.curves", "--wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        note_helper(self.process.pid)  # its CPU is the run's own, not another job's

    def draw(self, csv_path: Path, png_path: Path) -> None:
        self.tell(f"{csv_path}\t{png_path}\n")

    def cancel(self) -> None:
        self.tell("")
        self.process.wait()
        forget_helper(self.process.pid)

    def tell(self, text: str) -> None:
        stream, self.process.stdin = self.process.stdin, None  # communicate leaves it
        try:
            stream.write(text)
            stream.close()
        except OSError:  # it died; wait says so
            pass

    def wait(self) -> None:
        try:
            _, errors = self.process.communicate(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            logger.warning(f"the learning curves were not drawn within {self.TIMEOUT:g} s")
            return
        finally:
            forget_helper(self.process.pid)
        if self.process.returncode != 0:
            last = (errors or "").strip().splitlines()[-1:] or ["no message"]
            logger.warning(f"the learning curves were not drawn: {last[0]}")


class _Early:
    process: DrawingProcess | None = None


def start_early() -> None:
    """Start the drawing process now, for the run this process is about to train."""
    if _Early.process is None:
        _Early.process = DrawingProcess()


def drawing_process() -> DrawingProcess:
    """The process started early, or a new one."""
    process, _Early.process = _Early.process, None
    return process if process is not None else DrawingProcess()


def cancel_early() -> None:
    """This run draws no curves: the process started early ends."""
    process, _Early.process = _Early.process, None
    if process is not None:
        process.cancel()


def wait_for_paths() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the import is what is done ahead)

    line = sys.stdin.readline()
    if line.strip():
        csv_path, png_path = line.rstrip("\n").split("\t")
        plot_learning_curves(Path(csv_path), Path(png_path))


if __name__ == "__main__":
    if sys.argv[1:] == ["--wait"]:
        wait_for_paths()
    else:
        plot_learning_curves(Path(sys.argv[1]), Path(sys.argv[2]))
