"""``atomtrain convert DATA... -o DIR``: data files into a memory-mapped directory."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from ..data.conventions import Units
from ..data.convert import (
    Layout,
    Source,
    convert,
    convert_units,
    finish_output,
    plan,
    start_output,
)
from ..data.workers import stopped_by_signals
from ..distributed.context import initialize
from ..distributed.env import detect_launch
from ..errors import OptionsError
from ..io import output_errors
from ..options import DatasetOptions
from ..training.dataset_keys import target_keys
from .eval import dataset_options

# files of a converted directory that an mtt:: target's <key>.bin must not overwrite
RESERVED_KEYS = {"x", "a", "c", "energy", "forces", "stress", "ns", "na"}


def check_other_targets(sections: list[DatasetOptions]) -> None:
    """The mtt:: targets go to one ``<key>.bin`` each, with a row for every structure of
    the directory: every file must have the same ones, under keys that name no other
    file."""
    first = sections[0]
    wanted = [spec.record() for spec in first.targets.specs()]
    for section in sections:
        for spec in section.targets.specs():
            if spec.key in RESERVED_KEYS or spec.key.startswith("atomtrain_"):
                raise OptionsError(
                    f"{section.systems.read_from}: target {spec.name} has key '{spec.key}', "
                    f"the name of another file of a converted directory ({spec.key}.bin); "
                    "rename it in the data and in the section"
                )
        if [spec.record() for spec in section.targets.specs()] != wanted:
            raise OptionsError(
                f"{section.systems.read_from}: its targets "
                f"({', '.join(section.targets.others) or 'no mtt:: target'}) differ from "
                f"{first.systems.read_from}'s ({', '.join(first.targets.others) or 'none'}); "
                "a converted directory holds the same targets for every structure: convert "
                "them into separate directories"
            )


def run(arguments: argparse.Namespace) -> int:
    sections = [section for path in arguments.data for section in dataset_options(path)]
    check_other_targets(sections)
    sources = [
        Source(
            path=Path(section.systems.read_from),
            keys=target_keys(section, require_energy=False),
            units=Units(length=section.systems.length_unit, energy=section.targets.energy.unit),
        )
        for section in sections
    ]
    if arguments.nproc < 1:
        raise OptionsError(f"--nproc {arguments.nproc}: give at least 1 process")
    if any(cutoff <= 0 for cutoff in arguments.cutoff):
        raise OptionsError(f"--cutoff {arguments.cutoff}: cutoffs must be positive (angstrom)")
    layout = Layout(float64=arguments.float64, cutoffs=tuple(arguments.cutoff))
    start = time.perf_counter()
    launch = detect_launch(os.environ)
    if launch.is_distributed:
        if arguments.nproc != 1:
            raise OptionsError(
                f"--nproc {arguments.nproc} under {launch.kind}: the launcher already started "
                "the processes; leave --nproc out"
            )
        count = convert_as_ranks(sources, arguments.output, layout, launch)
        if launch.rank != 0:
            return 0
        arguments.nproc = launch.world_size
    else:
        count = convert(sources, arguments.output, layout, arguments.nproc)
    print(
        f"converted {count} structures from {len(sources)} file(s) into {arguments.output} "
        f"in {time.perf_counter() - start:.1f} s with {arguments.nproc} process(es)"
    )
    return 0


def convert_as_ranks(sources: list[Source], output: Path, layout: Layout, launch) -> int:
    """Under srun or torchrun: rank 0 plans, every rank converts its share of the
    frames into the staging directory (a file system all ranks share), rank 0 joins
    the parts. A failure on any rank stops all of them, and no output is left."""
    context = initialize(launch, "cpu", timeout=300.0)
    staging = None
    try:
        with context.guard(), stopped_by_signals(output):
            setup = None
            if context.is_main:
                staging = start_output(output)
                setup = (staging, plan(sources, context.world_size))
            staging, survey_plan = context.broadcast_object(setup)
            # one unit per rank, its own (the ranks share no counter)
            (done,) = convert_units(sources, survey_plan, iter([context.rank]), staging, layout)
            parts = [part for _, part in context.all_gather_objects(done)]
            total = sum(record["frames"] for record in survey_plan.records)
            if context.is_main:
                with output_errors(output, "data directory"):
                    total = finish_output(parts, staging, output, layout, survey_plan.records)
    except BaseException as error:
        if context.is_main and staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        context.fail(error)
        raise
    context.close()
    return total
