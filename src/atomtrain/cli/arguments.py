"""The command line's arguments, apart from the commands that act on them: ``--help``
and ``--version`` answer without importing torch (3.3 s of a command's start here), and
each command's module, cli/<command>.py with its ``run``, is imported when that command
runs (cli/main.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import __version__
from ..models import registry


def parser() -> argparse.ArgumentParser:
    main_parser = argparse.ArgumentParser(
        prog="atomtrain",
        description="Train machine-learning interatomic potentials (architectures: "
        f"{', '.join(registry.known())}) on one CPU, one GPU, several GPUs or many nodes.",
    )
    main_parser.add_argument("--version", action="version", version=f"atomtrain {__version__}")
    commands = main_parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (add_train, add_eval, add_export, add_convert):
        add(commands)
    return main_parser


def add_train(commands) -> None:
    parser = commands.add_parser(
        "train",
        help="train a model from an options file",
        description="Train a model from a YAML options file. Outputs go to "
        "outputs/YYYY-MM-DD/HH-MM-SS/ (log, CSV, checkpoints, exported model.pt).",
    )
    parser.add_argument("options", type=Path, help="YAML options file")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="also write the exported model here"
    )
    parser.add_argument(
        "-r",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an option, e.g. -r architecture.training.num_epochs=5",
    )
    parser.add_argument(
        "--restart",
        default=None,
        metavar="auto|CHECKPOINT",
        help="continue a run: 'auto' takes the newest run under outputs/, or "
        "give a checkpoint; the run continues in the checkpoint's directory",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="start this many worker processes on this machine",
    )
    parser.add_argument(
        "--outputs",
        type=Path,
        default=Path("outputs"),
        help="directory holding the runs (default: outputs)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="read the options and every data file, say what the run would do (data, "
        "model, steps, processes) and exit without training: a check before queueing a job",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="put this run in RUN_DIR instead of outputs/DATE/TIME; with --restart auto, "
        "or after a torchrun restart, it resumes from RUN_DIR's newest complete checkpoint",
    )


def add_eval(commands) -> None:
    parser = commands.add_parser(
        "eval",
        help="evaluate a model on a data set",
        description="Predict energies, forces and stress of an exported model (or of the "
        "best model of a checkpoint) on DATA (an extended XYZ file or another format ASE "
        "reads, or a YAML file with systems and targets as in metatrain's eval), "
        "print RMSE and MAE where the data has reference values, and write the predictions "
        "as extended XYZ with a parity plot beside them.",
    )
    parser.add_argument(
        "model", type=Path, help="exported model (model.pt) or checkpoint (best model of a .ckpt)"
    )
    parser.add_argument("data", type=Path, help="data file or YAML data description")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("predictions.xyz"),
        help="predictions file (default: predictions.xyz); the parity plot goes next to it as .png",
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=16,
        help="structures per evaluation batch (default: 16)",
    )


def add_export(commands) -> None:
    parser = commands.add_parser(
        "export",
        help="export a checkpoint to a metatomic model file for MD engines",
        description="Export the best model of a checkpoint as a metatomic model (model.pt, "
        "with the torch extensions it needs in extensions/ beside it), for ASE, i-PI, "
        "LAMMPS and TorchSim through metatomic, or atomtrain.ase.Calculator.",
    )
    parser.add_argument("checkpoint", type=Path, help="checkpoint (.ckpt) written by training")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("model.pt"),
        help="exported file (default: model.pt)",
    )


def add_convert(commands) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert data files into a memory-mapped data directory",
        description="Stream data files (extended XYZ or any format ASE reads, a directory "
        "in metatrain's layout written by another tool, or a YAML data section with keys "
        "and units, as eval takes) into a directory in metatrain's memory-mapped layout, "
        "which 'read_from: DIR' then trains on. Values are stored in angstrom and eV. Every "
        "frame is checked on the way in, once: training on the result skips those checks.",
    )
    parser.add_argument(
        "data", type=Path, nargs="+", help="data files, directories or YAML data sections"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory to create")
    parser.add_argument(
        "--float64",
        action="store_true",
        help="also store float64 copies of positions, cells and targets (float64 training "
        "on the directory is then exact; metatrain reads the float32 arrays)",
    )
    parser.add_argument(
        "--cutoff",
        type=float,
        nargs="+",
        default=[],
        metavar="R",
        help="also store each structure's neighbor pairs within R angstrom (the model's "
        "cutoff): training on several processes then deals batches by pairs without a "
        "neighbor search per structure at its start",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes converting the frames, which they take in contiguous units "
        "(default 1); the directory is byte-identical whatever the number",
    )
