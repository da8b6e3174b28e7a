"""``atomtrain convert DATA... -o DIR``: data files into a memory-mapped directory."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..data.convert import Source, convert
from ..data.extxyz import Units
from ..errors import OptionsError
from ..training.datasets import target_keys
from .eval import dataset_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert data files into a memory-mapped data directory",
        description="Stream data files (extended XYZ or any format ASE reads, or a YAML "
        "data section with keys and units, as eval takes) into a directory in metatrain's "
        "memory-mapped layout, which 'read_from: DIR' then trains on. Values are stored "
        "in angstrom and eV.",
    )
    parser.add_argument("data", type=Path, nargs="+", help="data files or YAML data sections")
    parser.add_argument("-o", "--output", type=Path, required=True, help="directory to create")
    parser.add_argument(
        "--float64",
        action="store_true",
        help="also store float64 copies of positions, cells and targets (float64 training "
        "on the directory is then exact; metatrain reads the float32 arrays)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes converting contiguous shares of the frames (default 1); the "
        "directory is byte-identical whatever the number",
    )
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    sources = [
        Source(
            path=Path(section.systems.read_from),
            keys=target_keys(section, require_energy=False),
            units=Units(length=section.systems.length_unit, energy=section.targets.energy.unit),
        )
        for path in arguments.data
        for section in dataset_options(path)
    ]
    if arguments.nproc < 1:
        raise OptionsError(f"--nproc {arguments.nproc}: give at least 1 process")
    start = time.perf_counter()
    count = convert(sources, arguments.output, arguments.float64, arguments.nproc)
    print(
        f"converted {count} structures from {len(sources)} file(s) into {arguments.output} "
        f"in {time.perf_counter() - start:.1f} s with {arguments.nproc} process(es)"
    )
    return 0
