"""What a run's figures and table say: units in train.csv's column names, whole epochs
and enough labelled ticks on the learning curves, errors written on parity panels."""

from __future__ import annotations

import csv

import ase.units
import matplotlib.pyplot as plt
import pytest

from atomtrain.training.figures import learning_curves_figure, parity_errors, parity_figure
from atomtrain.training.outputs import with_unit, without_unit


@pytest.mark.parametrize(
    "column, named",
    [
        ("validation_forces_rmse", "validation_forces_rmse (eV/A)"),
        ("train_energy_per_atom_mae", "train_energy_per_atom_mae (eV/atom)"),
        ("train_energy_rmse", "train_energy_rmse (eV)"),
        ("validation_si.xyz_stress_rmse", "validation_si.xyz_stress_rmse (eV/A^3)"),
        ("validation_virial_per_atom_rmse", "validation_virial_per_atom_rmse (eV/atom)"),
        ("train_mtt::dipole_rmse", "train_mtt::dipole_rmse (e*angstrom)"),
        ("train_mtt::gap_rmse", "train_mtt::gap_rmse"),  # declared without a unit
        ("learning_rate", "learning_rate"),
        ("train_loss", "train_loss"),
    ],
)
def test_csv_columns_carry_their_units(column, named):
    units = {"mtt::dipole": "e*angstrom", "mtt::gap": ""}
    assert with_unit(column, units) == named
    assert without_unit(named)[0] == column


def write_table(path, rows):
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_learning_curves_have_whole_epochs_and_labels_within_one_decade(tmp_path):
    """Stress RMSE from 9 down to 2.5 meV/A^3 over 7 epochs: matplotlib's log axis
    alone labelled one tick there (3e0), and its epoch axis showed 1.5, 2.5, ..."""
    rows = [
        {
            "epoch": epoch,
            "train_stress_rmse (eV/A^3)": 0.009 * (2.5 / 9) ** ((epoch - 1) / 6),
            "validation_stress_rmse (eV/A^3)": 0.0092 * (2.5 / 9) ** ((epoch - 1) / 6),
        }
        for epoch in range(1, 8)
    ]
    table = tmp_path / "train.csv"
    write_table(table, rows)
    figure = learning_curves_figure(table)
    (axis,) = [axis for axis in figure.axes if axis.get_visible()]
    figure.canvas.draw()
    low, high = axis.get_xlim()
    assert all(float(tick).is_integer() for tick in axis.get_xticks() if low <= tick <= high)
    low, high = axis.get_ylim()
    labelled = [
        tick.get_text()
        for tick, value in zip(axis.get_yticklabels(), axis.get_yticks())
        if tick.get_text() and low <= value <= high
    ]
    assert len(labelled) >= 3, labelled
    assert axis.get_ylabel() == "stress RMSE (meV/A^3)"
    plt.close(figure)


def test_parity_panels_give_rmse_and_mae_in_the_logs_units():
    text = parity_errors("force component (eV/A)", [0.0, 1.0], [0.003, 0.996])
    assert text == "RMSE 3.536 meV/A\nMAE 3.5 meV/A"
    stress = parity_errors("stress component (GPa)", [1.0, 2.0], [1.1, 2.1])
    gpa_in_mev = 1e3 * ase.units.GPa
    assert stress.splitlines()[0] == f"RMSE 0.1 GPa = {0.1 * gpa_in_mev:.4g} meV/A^3"
    figure = parity_figure({"force component (eV/A)": ([0.0, 1.0], [0.003, 0.996])})
    assert "RMSE 3.536 meV/A" in [text.get_text().splitlines()[0] for text in figure.axes[0].texts]
    plt.close(figure)


def curve_rows():
    return [
        {
            "epoch": epoch,
            "train_energy_rmse (eV)": 0.1 / epoch,
            "validation_energy_rmse (eV)": 0.2 / epoch,
        }
        for epoch in range(1, 4)
    ]


@pytest.mark.parametrize("figure", ["learning curves", "parity plot"])
def test_the_drawing_process_draws_the_figure_it_is_given(tmp_path, figure):
    """The process a command starts early: matplotlib imported ahead, the job given at
    the end (train's learning curves, eval's parity plot), the figure written."""
    from atomtrain.training.figures import DrawingProcess

    table = tmp_path / "train.csv"
    write_table(table, curve_rows())
    png = tmp_path / "figure.png"
    process = DrawingProcess()
    if figure == "learning curves":
        process.draw_curves(table, png)
    else:
        process.draw_parity({"energy per atom (eV)": ([-1.0, -2.0], [-1.1, -2.0])}, png)
    process.wait(figure)
    assert process.process.returncode == 0
    assert png.stat().st_size > 1000


def test_the_drawing_process_ends_quietly_when_no_curves_come(tmp_path):
    """A run that failed, or draws no figures: the early process ends with its input,
    writes nothing and says nothing."""
    from atomtrain.training.figures import DrawingProcess

    process = DrawingProcess()
    process.cancel()
    assert process.process.returncode == 0
    assert process.process.stderr.read() == b""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "check, kind, rank, figures, draws",
    [
        (False, "single", 0, True, True),
        (True, "single", 0, True, False),  # --check trains nothing
        (False, "spawn", 0, True, False),  # --nproc's launcher: its rank 0 draws
        (False, "torchrun", 1, True, False),
        (False, "slurm", 0, True, True),
        (False, "single", 0, False, False),  # logging.figures: false
    ],
)
def test_the_process_that_draws_the_curves_is_rank_0_of_a_run(check, kind, rank, figures, draws):
    import argparse

    from atomtrain.cli.train import draws_figures_here
    from atomtrain.distributed.env import LaunchInfo
    from atomtrain.options import parse_options

    options = parse_options({"training_set": "x.xyz", "logging": {"figures": figures}})
    launch = LaunchInfo(kind=kind, rank=rank, world_size=2 if kind != "single" else 1)
    assert draws_figures_here(argparse.Namespace(check=check), options, launch) == draws


def test_a_figure_that_cannot_be_drawn_is_one_warning(tmp_path, caplog):
    """A figure is a by-product: its failure (here a missing train.csv) is a warning
    that says which figure and why, and the command goes on."""
    from atomtrain.training.figures import DrawingProcess

    process = DrawingProcess()
    process.draw_curves(tmp_path / "missing.csv", tmp_path / "learning_curves.png")
    with caplog.at_level("WARNING", logger="atomtrain"):
        process.wait("learning curves")
    (record,) = caplog.records
    assert record.getMessage().startswith("learning curves not drawn: FileNotFoundError")
    assert "missing.csv" in record.getMessage()
    assert not (tmp_path / "learning_curves.png").exists()
