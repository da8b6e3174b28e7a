"""Convert ASE-readable files into a memory-mapped data directory, streaming: one frame
in memory at a time, whatever the size of the files.

The directory is metatrain's memmap layout (see memmap.py), so metatrain reads it, with
atomtrain's additions in files metatrain ignores:

- ``atomtrain.json``: the manifest (format version, units, target keys, counts, source
  files and the SHA-256 of every file written);
- ``atomtrain_pbc.bin``: uint8 (ns, 3) periodic directions (metatrain infers them from
  zero cell rows);
- ``atomtrain_known.bin``: uint8 (ns, 3), whether each structure's energy, forces and
  stress are known (unknown ones are stored as zeros);
- with ``float64``: ``atomtrain_x64.bin``, ``atomtrain_c64.bin`` and
  ``atomtrain_<target>64.bin``, the same arrays in float64, so that float64 training
  on the directory is exact;
- with ``cutoffs``: ``atomtrain_pairs_<cutoff>.bin``, int32 (ns,), each structure's
  neighbor pairs within that cutoff (full list), so that training deals batches to its
  processes by pairs without a neighbor search per structure when it starts.

Values are stored in angstrom and eV (metatrain's defaults). The directory is written
under a hidden temporary name beside the output and renamed when complete, so an
interrupted conversion never leaves a directory that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import DataError, OptionsError
from ..io import output_errors, process_umask
from ..targets import TargetSpec
from .columns import StructureValues
from .conventions import TargetKeys, Units
from .extxyz import (
    FRAMES_PER_CHUNK,
    FrameReader,
    file_format,
    iterate_frames,
    targets_wanted,
)
from .frames import Frames, FrameSet
from .layout import FORMAT, MANIFEST, Layout, pairs_file, sampled_sha256, sha256
from .neighbors import compute_neighbor_list
from .workers import SharedCounter, run_in_processes, stopped_by_signals

logger = logging.getLogger(__name__)

TARGETS = ("energy", "forces", "stress")
# work units per --nproc process: one whose units take longer (larger structures, a
# slower core) takes fewer
UNITS_PER_PROCESS = 8


@dataclass
class Source:
    """One input file, its target keys and units."""

    path: Path
    keys: TargetKeys = field(default_factory=TargetKeys)
    units: Units = field(default_factory=Units)


class ArrayFiles:
    """Open .bin files that frames are appended to."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.streams: dict[str, IO[bytes]] = {}

    def append(self, name: str, values: np.ndarray, dtype) -> None:
        if name not in self.streams:
            self.streams[name] = open(self.directory / name, "wb")  # noqa: SIM115
        self.streams[name].write(np.ascontiguousarray(values, dtype=dtype).tobytes())

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


class Converter:
    """Appends structures to the arrays of one part of a directory being written."""

    def __init__(self, directory: Path, layout: Layout):
        self.files = ArrayFiles(directory)
        self.float64 = layout.float64
        self.cutoffs = layout.cutoffs
        self.atom_counts: list[int] = []
        self.with_target = dict.fromkeys(TARGETS, False)

    def add(self, structure: StructureValues, others: tuple[TargetSpec, ...] = ()) -> None:
        """``structure`` appended; ``others``: its mtt:: targets, each to ``<key>.bin``
        (rows of [width] or, per atom, [atoms, width], as the directory reader takes
        them)."""
        positions = structure.positions
        n_atoms = positions.shape[0]
        self.atom_counts.append(n_atoms)
        self.store("x.bin", "atomtrain_x64.bin", positions)
        self.files.append("a.bin", structure.atomic_numbers, np.int32)
        self.store("c.bin", "atomtrain_c64.bin", structure.cell)
        self.files.append("atomtrain_pbc.bin", structure.pbc, np.uint8)
        values = {
            "energy": None if structure.energy is None else np.array([structure.energy]),
            "forces": structure.forces,
            "stress": structure.stress,
        }
        shapes = {"energy": (1,), "forces": (n_atoms, 3), "stress": (3, 3)}
        for name in TARGETS:
            known = values[name] is not None
            self.with_target[name] |= known
            value = values[name] if known else np.zeros(shapes[name])
            self.store(f"{name}.bin", f"atomtrain_{name}64.bin", value)
        self.files.append(
            "atomtrain_known.bin", [values[name] is not None for name in TARGETS], np.uint8
        )
        for spec in others:
            values = structure.targets[spec.name]
            self.store(f"{spec.key}.bin", f"atomtrain_{spec.key}64.bin", values)
        for cutoff in self.cutoffs:
            pairs = compute_neighbor_list(positions, structure.cell, structure.pbc, cutoff).n_pairs
            self.files.append(pairs_file(cutoff), [pairs], np.int32)

    def store(self, name: str, wide_name: str, values: np.ndarray) -> None:
        self.files.append(name, values, np.float32)
        if self.float64:
            self.files.append(wide_name, values, np.float64)


@dataclass
class Share:
    """Frames ``start`` to ``stop`` of source ``source`` (an index into the sources)."""

    source: int
    start: int
    stop: int


@dataclass
class Plan:
    """What every process needs to convert its share, found by one pass over the
    sources: their manifest records (path, frames, SHA-256), the targets read from each,
    each extended XYZ file's chunk offsets (None for other formats) and the shares."""

    records: list[dict]
    wanted: list[tuple[bool, bool]]
    chunk_offsets: list[np.ndarray | None]
    shares: list[list[Share]]


@dataclass
class Part:
    """What one process wrote: its files, atom counts and which targets it saw."""

    directory: Path
    atom_counts: list[int]
    with_target: dict[str, bool]


def convert(
    sources: list[Source], output: Path, layout: Layout | None = None, processes: int = 1
) -> int:
    """Write ``sources`` into the directory ``output``; the number of structures. With
    several ``processes``, the frames are cut into contiguous units that the processes
    take in turn (one whose units take longer takes fewer), and the units are
    joined in order: the result is byte-identical to one process's."""
    layout = layout or Layout()
    staging = start_output(output)
    with output_errors(output, "data directory"), stopped_by_signals(output):
        try:
            survey_plan = plan(sources, processes, UNITS_PER_PROCESS if processes > 1 else 1)
            job = (sources, survey_plan, SharedCounter(), staging, layout)
            if processes == 1:
                results = [convert_units(*job)]
            else:
                results = run_in_processes(convert_units, [job] * processes, output)
            done = sorted((unit for result in results for unit in result), key=lambda u: u[0])
            parts = [part for _, part in done]
            return finish_output(parts, staging, output, layout, survey_plan.records)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def start_output(output: Path) -> Path:
    """Check that ``output`` can be created; the hidden staging directory beside it."""
    if output.exists():
        raise OptionsError(f"{output} already exists; remove it or choose another output")
    if not output.parent.resolve().is_dir():
        raise OptionsError(f"{output}: directory {output.parent} does not exist; create it")
    with output_errors(output, "data directory"):
        return Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.partial-"))


def plan(sources: list[Source], processes: int, units_per_process: int = 1) -> Plan:
    """Survey the sources and cut their frames into work units: one per process, or
    with ``units_per_process`` more than one, none smaller than a chunk of frames."""
    # first what a source's opening refuses (a directory atomtrain converted already),
    # before the survey reads every byte of every source
    wanted = [first_frame_targets(source) for source in sources]
    surveys = [survey(source.path) for source in sources]
    records = [
        {"path": str(source.path), "frames": frames, "sha256": digest}
        for source, (frames, digest, _) in zip(sources, surveys)
    ]
    counts = [record["frames"] for record in records]
    units = min(processes * units_per_process, sum(counts) // FRAMES_PER_CHUNK)
    return Plan(
        records=records,
        wanted=wanted,
        chunk_offsets=[offsets for _, _, offsets in surveys],
        shares=split_frames(counts, max(processes, units)),
    )


def finish_output(
    parts: list[Part],
    staging: Path,
    output: Path,
    layout: Layout,
    records: list[dict],
) -> int:
    """Join the parts, write counts and manifest, and rename the staging directory to
    ``output``; the number of structures."""
    total = join_parts(parts, staging, layout, records)
    os.chmod(staging, 0o777 & ~process_umask())
    os.rename(staging, output)
    return total


def split_frames(counts: list[int], units: int) -> list[list[Share]]:
    """Contiguous pieces of all frames (every file one after the other), as equal as
    they can be, ``units`` of them."""
    total = sum(counts)
    bounds = [total * number // units for number in range(units + 1)]
    shares: list[list[Share]] = []
    for first, last in zip(bounds[:-1], bounds[1:]):
        mine: list[Share] = []
        offset = 0
        for source, count in enumerate(counts):
            start, stop = max(first - offset, 0), min(last - offset, count)
            if start < stop:
                mine.append(Share(source, start, stop))
            offset += count
        shares.append(mine)
    return shares


def first_frame_targets(source: Source) -> tuple[bool, bool]:
    """Forces and stress are read from every frame of a file when its first frame has
    them (or the keys say so), as when training reads the file; from a directory when
    it has their files."""
    if source.path.is_dir():
        frames, _ = open_source_directory(source)
        return frames.forces is not None, frames.stress is not None
    first = next(iterate_frames(source.path))
    return targets_wanted(first, source.keys)


def open_source_directory(source: Source) -> tuple[Frames, FrameReader]:
    """A memmap directory from another tool (metatrain's layout) given to convert: its
    frames are checked as they are converted, as a file's are."""
    from .memmap import open_directory  # memmap reads manifests from this module

    frames, reader = open_directory(source.path, source.keys, source.units)
    if reader.checked:
        raise OptionsError(
            f"{source.path}: atomtrain convert wrote this directory already; train on it as it is"
        )
    return frames, reader


def convert_directory_share(source: Source, share: Share, converter: Converter) -> None:
    from .memmap import check_frames

    frames, reader = open_source_directory(source)
    check_frames(frames, reader, source.keys, share.start, share.stop)
    structures = FrameSet.whole(frames)
    for index in range(share.start, share.stop):
        converter.add(structures[index], source.keys.others)


def convert_units(
    sources: list[Source],
    survey_plan: Plan,
    numbers: Iterator[int],
    directory: Path,
    layout: Layout,
) -> list[tuple[int, Part]]:
    """Convert the work units ``numbers`` hands out, each into ``directory/unit-N``,
    until it runs out or hands out a number past the last unit; (number, part) each."""
    done = []
    for number in numbers:
        if number >= len(survey_plan.shares):
            break
        part = convert_unit(sources, survey_plan, number, directory / f"unit-{number}", layout)
        done.append((number, part))
    return done


def convert_unit(
    sources: list[Source], survey_plan: Plan, number: int, directory: Path, layout: Layout
) -> Part:
    """Convert work unit ``number`` of the plan into the part ``directory``."""
    directory.mkdir()
    converter = Converter(directory, layout)
    for share in survey_plan.shares[number]:
        source = sources[share.source]
        if source.path.is_dir():
            convert_directory_share(source, share, converter)
            continue
        reader = FrameReader(source.path, source.keys, source.units)
        offsets = survey_plan.chunk_offsets[share.source]
        frames = iterate_frames(source.path, share.start, share.stop, offsets)
        for index, atoms in enumerate(frames, start=share.start):
            structure = reader.values(index, atoms, *survey_plan.wanted[share.source])
            converter.add(structure, source.keys.others)
        reader.report_close_pairs()
    converter.files.close()
    return Part(directory, converter.atom_counts, converter.with_target)


def join_parts(parts: list[Part], directory: Path, layout: Layout, sources: list[dict]) -> int:
    """The parts' files joined in order into ``directory``, with the counts and the
    manifest; the number of structures."""
    with_target = {name: any(part.with_target[name] for part in parts) for name in TARGETS}
    names = sorted({file.name for part in parts for file in part.directory.iterdir()})
    for name in names:
        target = next((t for t in TARGETS if name in (f"{t}.bin", f"atomtrain_{t}64.bin")), None)
        if target is not None and not with_target[target]:
            continue  # no structure has it: no file, as metatrain's writer does
        with open(directory / name, "wb") as joined:
            for part in parts:
                if (part.directory / name).is_file():
                    with open(part.directory / name, "rb") as piece:
                        shutil.copyfileobj(piece, joined, 1 << 20)
    for part in parts:
        shutil.rmtree(part.directory)
    atom_counts = [count for part in parts for count in part.atom_counts]
    # metatrain's writer saves ns as a 0-d array; its reader takes that
    np.save(directory / "ns.npy", np.array(len(atom_counts), dtype=np.int64))
    np.save(directory / "na.npy", np.concatenate([[0], np.cumsum(atom_counts)]).astype(np.int64))
    manifest = {
        "format": FORMAT,
        "units": {"length": "angstrom", "energy": "eV"},
        "keys": {name: name for name in TARGETS if with_target[name]},
        "structures": len(atom_counts),
        "atoms": int(sum(atom_counts)),
        "float64": layout.float64,
        "pair_counts": {repr(float(cutoff)): pairs_file(cutoff) for cutoff in layout.cutoffs},
        # what every frame passed on its way in (FrameReader.values): a reader that
        # finds every checksum unchanged need not check the frames again
        "checked": ["finite values", "no atoms on top of each other"],
        "sources": sources,
    }
    written = [file for file in sorted(directory.iterdir()) if file.is_file()]
    manifest["files"] = {file.name: sha256(file) for file in written}
    manifest["sizes"] = {file.name: file.stat().st_size for file in written}
    manifest["sampled_sha256"] = {file.name: sampled_sha256(file) for file in written}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return len(atom_counts)


def survey(path: Path) -> tuple[int, str, np.ndarray | None]:
    """How many frames ``path`` holds, its SHA-256 and, for extended XYZ, the byte
    offset of every FRAMES_PER_CHUNK-th frame and of the end (see extxyz_chunks): in one
    pass over the bytes, skipping lines (no parsing). Other formats are read one frame at
    a time and have no offsets."""
    if not path.exists():
        raise DataError(f"{path}: data file not found; check the path")
    if path.is_dir():
        return directory_survey(path)
    if file_format(path) != "extxyz":
        return sum(1 for _ in iterate_frames(path)), sha256(path), None
    count = 0
    digest = hashlib.sha256()
    offsets: list[int] = []
    position = 0
    with open(path, "rb") as stream:
        for line in stream:
            digest.update(line)
            if not line.strip():
                position += len(line)
                continue
            if count % FRAMES_PER_CHUNK == 0:
                offsets.append(position)
            position += len(line)
            try:
                n_atoms = int(line)
            except ValueError as error:
                raise DataError(
                    f"{path}, frame {count}: expected a line with the number of atoms, found "
                    f"{line[:40]!r}"
                ) from error
            for _ in range(n_atoms + 1):
                line = next(stream, b"")
                digest.update(line)
                position += len(line)
            count += 1
    if count == 0:
        raise DataError(f"{path}: the file holds no structure")
    return count, digest.hexdigest(), np.array([*offsets, position], dtype=np.int64)


def directory_survey(path: Path) -> tuple[int, str, None]:
    """A memmap directory's structures, and one SHA-256 over its files (names and
    bytes, in name order)."""
    from .memmap import MemmapDirectory

    count = MemmapDirectory(path).count
    digest = hashlib.sha256()
    for file in sorted(item for item in path.iterdir() if item.is_file()):
        digest.update(f"{file.name}\n{sha256(file)}\n".encode())
    return count, digest.hexdigest(), None
