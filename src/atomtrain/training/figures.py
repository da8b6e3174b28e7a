"""A run's figures, drawn by a process of their own: the learning curves
(learning_curves.png, from train.csv) and eval's parity plot.

    python -m atomtrain.training.figures train.csv learning_curves.png
    python -m atomtrain.training.figures --wait   # one pickled job comes on stdin

A command that will draw starts the second form as soon as its arguments and options
are checked (``start_early``), before it imports torch: Python, numpy and matplotlib
(0.6 s) are then imported on a core the command leaves idle, and at the end only the
drawing remains, alongside the export or the writing of predictions
(docs/performance-notes.md, "Short runs")."""

from __future__ import annotations

import csv
import logging
import math
import pickle
import subprocess
import sys
from pathlib import Path

import ase.units
import numpy as np

from ..runtime import forget_helper, note_helper
from ..targets import target_of_metric
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
    stress in meV units, other targets in their files' units), at most three panels a
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
        if name.endswith("_rmse") and target_of_metric(name):
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


def parity_plot(path: Path, pairs: dict[str, tuple[list[float], list[float]]]) -> None:
    import matplotlib.pyplot as plt

    figure = parity_figure(pairs)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parity_figure(pairs: dict[str, tuple[list[float], list[float]]]):
    """Predicted against reference values, a panel per quantity, each with its RMSE and
    MAE (in the log's units: meV/atom, meV/A; stress in GPa and meV/A^3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 4.3))
    axes = axes if hasattr(axes, "__len__") else [axes]
    for axis, (name, (reference, predicted)) in zip(axes, pairs.items()):
        axis.scatter(reference, predicted, s=4, alpha=0.6)
        low, high = min(reference + predicted), max(reference + predicted)
        axis.plot([low, high], [low, high], color="black", linewidth=0.8)
        axis.set_xlabel(f"reference {name}")
        axis.set_ylabel(f"predicted {name}")
        axis.text(
            0.04,
            0.96,
            parity_errors(name, reference, predicted),
            transform=axis.transAxes,
            verticalalignment="top",
            fontsize=9,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
        # large values (energies of -654.1 eV/atom) have long labels: fewer, slanted ticks
        axis.xaxis.set_major_locator(MaxNLocator(4))
        axis.yaxis.set_major_locator(MaxNLocator(5))
        axis.ticklabel_format(useOffset=False)
        axis.tick_params(axis="x", labelrotation=30)
        axis.set_aspect("equal", adjustable="datalim")
    figure.tight_layout()
    return figure


# a parity panel's errors in the log's units: (factor from the panel's unit, unit)
PARITY_UNITS = {
    "energy per atom (eV)": [(1e3, "meV/atom")],
    "force component (eV/A)": [(1e3, "meV/A")],
    "stress component (GPa)": [(1.0, "GPa"), (1e3 * ase.units.GPa, "meV/A^3")],
}


def parity_errors(name: str, reference: list[float], predicted: list[float]) -> str:
    """'RMSE ... / MAE ...' of one panel, in each of its units."""
    difference = np.asarray(predicted, dtype=np.float64) - np.asarray(reference, np.float64)
    rmse, mae = float(np.sqrt(np.mean(difference**2))), float(np.mean(np.abs(difference)))
    lines = []
    for label, value in (("RMSE", rmse), ("MAE", mae)):
        shown = [f"{value * factor:.4g} {unit}" for factor, unit in PARITY_UNITS.get(name, [])]
        lines.append(f"{label} " + (" = ".join(shown) if shown else f"{value:.4g}"))
    return "\n".join(lines)


class DrawingProcess:
    """A child that imports matplotlib at once, then draws the figure it is given (one
    job). An end of its input before any job (a command that failed, or draws no
    figure, or whose process died) ends it without a word."""

    TIMEOUT = 300.0  # seconds: a wedged plot must not keep a finished command alive

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, "--wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        note_helper(self.process.pid)  # its CPU is the command's own, not another job's

    def draw_curves(self, csv_path: Path, png_path: Path) -> None:
        self.send(pickle.dumps(("curves", str(csv_path), str(png_path))))

    def draw_parity(
        self, pairs: dict[str, tuple[list[float], list[float]]], png_path: Path
    ) -> None:
        self.send(pickle.dumps(("parity", pairs, str(png_path))))

    def cancel(self) -> None:
        self.send(b"")
        self.process.wait()
        forget_helper(self.process.pid)

    def send(self, job: bytes) -> None:
        stream, self.process.stdin = self.process.stdin, None  # communicate leaves it
        try:
            stream.write(job)
            stream.close()
        except OSError:  # it died; wait says so
            pass

    def wait(self, what: str) -> None:
        """Wait for the figure; a failure is a warning: "<what> not drawn: <why>"."""
        try:
            _, errors = self.process.communicate(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            logger.warning(f"{what} not drawn within {self.TIMEOUT:g} s")
            return
        finally:
            forget_helper(self.process.pid)
        if self.process.returncode != 0:
            said = (errors or b"").decode(errors="replace").strip().splitlines()[-1:]
            logger.warning(f"{what} not drawn: {(said or ['no message'])[0]}")


class _Early:
    process: DrawingProcess | None = None


def start_early() -> None:
    """Start the drawing process now, for the figure this command will draw."""
    if _Early.process is None:
        _Early.process = DrawingProcess()


def drawing_process() -> DrawingProcess:
    """The process started early, or a new one."""
    return started_early() or DrawingProcess()


def started_early() -> DrawingProcess | None:
    """The process started early, if one was (a command's process), now the caller's."""
    process, _Early.process = _Early.process, None
    return process


def cancel_early() -> None:
    """This command draws no figure: the process started early ends."""
    process = started_early()
    if process is not None:
        process.cancel()


def draw_what_comes() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the import is what is done ahead)

    try:
        kind, data, png_path = pickle.load(sys.stdin.buffer)  # from the parent only
    except EOFError:
        return
    if kind == "curves":
        plot_learning_curves(Path(data), Path(png_path))
    else:
        parity_plot(Path(png_path), data)


if __name__ == "__main__":
    if sys.argv[1:] == ["--wait"]:
        draw_what_comes()
    else:
        plot_learning_curves(Path(sys.argv[1]), Path(sys.argv[2]))
