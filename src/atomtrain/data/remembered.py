"""A data file read once: the arrays its structures were read into are kept in the
user's cache, so that the next run on the same file (a hyperparameter scan, a
fine-tuning, a restart) loads them instead of importing ASE's readers (0.5 s) and
parsing the file again (about 1 ms a structure).

An entry is found by the file's bytes (SHA-256) and by how it was read: the target keys,
the units, the reading code itself and ASE's version, so that a changed file, other
keys, another atomtrain or another ASE read it anew. Entries hold plain arrays (numpy's
.npz, read without pickle) and the warnings reading gave, which are given again. A file
larger than ``LARGEST_FILE`` is not kept (``atomtrain convert`` makes such data a
memory-mapped directory, read without parsing); the cache keeps at most ``BUDGET``
bytes, dropping the entries used least recently. ``ATOMTRAIN_DATA_CACHE`` names another
folder, or ``off``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ase  # its version only (imported by atomtrain.units already)
import numpy as np

from ..runtime import forget_helper, user_cache
from .columns import Frames, TargetColumn
from .conventions import TargetKeys, Units

logger = logging.getLogger(__name__)

VARIABLE = "ATOMTRAIN_DATA_CACHE"
LARGEST_FILE = 256 * 2**20
BUDGET = 2 * 2**30
# the code whose results an entry holds (in the atomtrain package), with ASE's version:
# an entry written by other code is not used
READING_CODE = ("targets.py", "units.py", "data/conventions.py", "data/extxyz.py")
READING_CODE += ("data/columns.py", "data/frames.py", "data/reading.py", "data/remembered.py")
READING_CODE += ("data/system.py",)
ARRAYS = ("offsets", "positions", "numbers", "cells", "pbc", "energy", "forces", "stress")
ARRAYS += ("energy_known", "forces_known", "stress_known", "weights")
PARTIAL = ".partial"  # an entry being written; one a killed run left is dropped later


def cache_folder() -> Path | None:
    """Where entries live: ``ATOMTRAIN_DATA_CACHE``, or atomtrain/frames in the user's
    cache (beside inductor's); None when the variable says off."""
    given = os.environ.get(VARIABLE, "")
    if given.lower() in ("off", "0", "false", "no"):
        return None
    if given:
        return Path(given)
    return user_cache() / "frames"


def entry_name(path: Path, keys: TargetKeys, units: Units) -> str | None:
    """The entry of ``path`` read with ``keys`` and ``units``; None for a file too large
    to keep, or one that cannot be read."""
    digest = hashlib.sha256()
    try:
        if path.stat().st_size > LARGEST_FILE:
            return None
        with open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    except OSError:  # not readable: the reader says so
        return None
    digest.update(reading_code())
    digest.update(repr((keys, units, ase.__version__)).encode())
    return digest.hexdigest()[:40] + ".npz"


@functools.cache
def reading_code() -> bytes:
    """The digest of READING_CODE's files, read once a process."""
    package = Path(__file__).parents[1]
    return hashlib.sha256(b"".join((package / name).read_bytes() for name in READING_CODE)).digest()


class ReadElsewhere:
    """The entries a command named as it started (data/ahead.py), each file hashed once
    for the command, and the child process reading the missing ones into the cache: a
    reading takes its entry's name from here, and waits for the child if it writes it."""

    names: dict[tuple[str, TargetKeys, Units], str] = {}  # (file, keys, units) -> entry
    process: subprocess.Popen | None = None
    written: frozenset[str] = frozenset()  # the entries the child writes

    @classmethod
    def entry_of(cls, path: Path, keys: TargetKeys, units: Units) -> str | None:
        """The entry named at the start, once the child has written it; asked once (a
        later reading of the file hashes it again)."""
        name = cls.names.pop((str(path), keys, units), None)
        if name in cls.written:
            cls.wait()
        return name

    @classmethod
    def wait(cls) -> None:
        """Until the child, if one was started, has written its entries."""
        if cls.process is not None:
            cls.process.wait()
            forget_helper(cls.process.pid)


def read_remembered(
    path: Path, keys: TargetKeys, units: Units, read: Callable[[], Frames]
) -> Frames:
    """``read()``'s frames of ``path``, from the cache when this file was read so before
    (its warnings given again), else read and kept."""
    folder = cache_folder()
    if folder is None:
        return read()
    name = ReadElsewhere.entry_of(path, keys, units) or entry_name(path, keys, units)
    if name is None:
        return read()
    entry = folder / name
    found = load_entry(entry, str(path))
    if found is not None:
        frames, warnings = found
        for logger_name, level, message in warnings:
            logging.getLogger(logger_name).log(level, message)
        # debug: the arrays are those of a reading, and the line would be one more per
        # file in every run's output
        logger.debug(
            f"{path}: {len(frames)} structures as read before, from {folder} "
            f"({VARIABLE}=off reads files anew)"
        )
        return frames
    return read_and_keep(folder, entry, read)


def read_and_keep(folder: Path, entry: Path, read: Callable[[], Frames]) -> Frames:
    """``read()``'s frames, kept in the cache as ``entry`` with the warnings it gave."""
    with recorded_warnings() as warnings:
        frames = read()
    save_entry(folder, entry, frames, warnings)
    return frames


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[tuple[str, int, str]]]:
    """The warnings atomtrain's data readers log meanwhile, as (logger, level, text)."""
    records: list[tuple[str, int, str]] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.name, record.levelno, record.getMessage()))

    handler = Recorder(level=logging.WARNING)
    readers = logging.getLogger(__package__)
    readers.addHandler(handler)
    try:
        yield records
    finally:
        readers.removeHandler(handler)


def save_entry(
    folder: Path, entry: Path, frames: Frames, warnings: list[tuple[str, int, str]]
) -> None:
    """Write the entry under a temporary name and rename it, so that a run never reads
    half an entry; a cache that cannot be written only costs the next run a reading."""
    arrays = {name: getattr(frames, name) for name in ARRAYS if getattr(frames, name) is not None}
    targets = list(frames.targets.items())
    for number, (_, column) in enumerate(targets):
        arrays[f"target{number}_values"] = column.values
        arrays[f"target{number}_known"] = column.known
    described = {
        "targets": [[name, column.per_atom] for name, column in targets],
        "warnings": warnings,
    }
    arrays["described"] = np.array(json.dumps(described))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=folder, suffix=PARTIAL)
    except OSError as error:
        logger.debug(f"the data cache {folder} was not written: {error}")
        return
    try:
        with os.fdopen(descriptor, "wb") as file:
            np.savez(file, **arrays)
        os.replace(temporary, entry)
    except OSError as error:
        logger.debug(f"the data cache {folder} was not written: {error}")
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return
    keep_within_budget(folder)


def load_entry(entry: Path, source: str) -> tuple[Frames, list] | None:
    """The frames and warnings of ``entry``, or None where it is missing or unreadable
    (cut short by a full disk, written by a version of numpy that cannot be read)."""
    try:
        with np.load(entry, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
        os.utime(entry)  # used now: the last to be dropped
    except Exception:  # a missing, partial or foreign file is read anew
        return None
    described = json.loads(str(arrays.pop("described")))
    targets = {
        name: TargetColumn(
            arrays.pop(f"target{number}_values"), arrays.pop(f"target{number}_known"), per_atom
        )
        for number, (name, per_atom) in enumerate(described["targets"])
    }
    frames = Frames(source=source, targets=targets, **{name: arrays.get(name) for name in ARRAYS})
    return frames, [tuple(warning) for warning in described["warnings"]]


def keep_within_budget(folder: Path) -> None:
    """Drop the entries used least recently until the cache holds at most BUDGET, and
    the partial entries of runs killed while writing one (an hour old)."""
    try:
        entries = [(path.stat(), path) for path in folder.iterdir()]
    except OSError:
        return
    entries.sort(key=lambda item: item[0].st_mtime, reverse=True)
    total, hour_ago = 0, time.time() - 3600
    for status, path in entries:
        if path.suffix == PARTIAL:
            stale = status.st_mtime < hour_ago
        else:
            total += status.st_size
            stale = total > BUDGET
        if stale:
            with contextlib.suppress(OSError):
                path.unlink()
