"""Atomic file writes: a reader never sees a half-written file replacing a good one."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import AtomtrainError

# Fault injection for the tests: "NAME:K" stops the K-th write of a file called NAME (1
# when K is left out) after its first bytes and leaves NAME.stalled beside it; the write
# goes on once a test removes that file, or never if the test kills the process there.
STALL_VARIABLE = "ATOMTRAIN_TEST_STALL_WRITE"
STALL_AFTER_BYTES = 4096
_writes_seen: dict[str, int] = {}


class OutputError(AtomtrainError):
    """An output cannot be written: the disk is full, or the directory is not writable."""


def process_umask() -> int:
    """This process's umask, read without changing it (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _StallingFile:
    """A file whose writing stops once after its first bytes, until the test says."""

    def __init__(self, stream: IO[Any], marker: Path):
        self.stream = stream
        self.marker = marker
        self.written = 0
        self.stalled = False

    def write(self, data) -> int:
        count = self.stream.write(data)
        self.written += count
        if self.written >= STALL_AFTER_BYTES and not self.stalled:
            self.stalled = True
            self.stream.flush()
            self.marker.write_text(str(os.getpid()))
            while self.marker.exists():
                time.sleep(0.05)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _stall_here(path: Path) -> bool:
    wanted = os.environ.get(STALL_VARIABLE)
    if not wanted:
        return False
    name, _, occurrence = wanted.partition(":")
    if name != path.name:
        return False
    _writes_seen[name] = _writes_seen.get(name, 0) + 1
    return _writes_seen[name] == int(occurrence or 1)


def disk_nearly_full(directory: Path, margin: int = 1 << 20) -> bool:
    """Less than ``margin`` bytes left for this user on the file system of ``directory``
    (checked while a failed write's temporary still holds its space)."""
    try:
        status = os.statvfs(directory)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < margin


def _disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def atomic_write(
    path: str | Path,
    write: Callable[[IO[Any]], None],
    binary: bool = True,
    what: str = "file",
) -> None:
    """Call ``write`` on an open temporary file in the same directory, then rename it to
    ``path`` with the permissions the umask gives new files. A crash leaves the previous
    file (if any) untouched and no temporary behind; a full disk or an unwritable
    directory is an OutputError naming ``path`` as ``what`` (checkpoint, model, ...)."""
    path = Path(path)
    with output_errors(path, what):
        handle, temporary = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(handle, "wb" if binary else "w") as stream:
                if _stall_here(path):
                    write(_StallingFile(stream, path.with_name(path.name + ".stalled")))
                else:
                    write(stream)
            # mkstemp creates 0600 files: give the file the mode any new file would get
            os.chmod(temporary, 0o666 & ~process_umask())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)


def atomic_save_with_directory(
    path: Path, save: Callable[[Path, Path], None], directory: Path, what: str
) -> None:
    """``save(file, folder)`` writes a file and a folder of files it needs into a
    temporary staging directory; the folder's files are then moved into ``directory``
    (kept files there stay) and the file renamed to ``path`` last, so that ``path``
    never exists without what it needs. Errors as in :func:`atomic_write`."""
    with output_errors(path, what):
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        try:
            save(staging / path.name, staging / directory.name)
            merge_directory(staging / directory.name, directory)
            os.chmod(staging / path.name, 0o666 & ~process_umask())
            os.replace(staging / path.name, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def merge_directory(source: Path, destination: Path) -> None:
    """Move every file under ``source`` to the same place under ``destination``,
    replacing files of the same name and leaving the others. ``destination`` exists
    afterwards, empty when ``source`` held nothing: engines and the MD examples look for
    a model's extensions directory beside it (a MACE model needs none, and its export
    once left none, so that examples/md refused to run it)."""
    destination.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    for file in sorted(source.rglob("*")):
        if file.is_dir():
            continue
        target = destination / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)


@contextlib.contextmanager
def output_errors(path: Path, what: str) -> Iterator[None]:
    """Turn a failed write of ``path`` into an OutputError that says why."""
    try:
        yield
    except OSError as error:
        raise output_error(path, what, error) from error
    except Exception as error:
        # torch's writers report a failed write as a RuntimeError about file positions
        if disk_nearly_full(path.parent):
            raise output_error(path, what, OSError(errno.ENOSPC, "disk full")) from error
        raise


def output_error(path: Path, what: str, error: OSError) -> OutputError:
    if _disk_full(error):
        return OutputError(
            f"no space left on device while writing {what} {path}; free some space (the "
            "previous version of the file, if any, is intact)"
        )
    return OutputError(
        f"cannot write {what} {path} ({error.strerror or error}); check that its directory "
        "exists and is writable"
    )


def check_writable_directory(directory: Path, hint: str) -> None:
    """Fail before any work when ``directory`` (or the nearest existing parent it would
    be created in) cannot be written to; ``hint`` says what to do instead."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    place = directory.resolve()
    if not existing.is_dir():
        raise OutputError(
            f"cannot write to {place}: {existing.resolve()} is not a directory; {hint}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write to {place}: {existing.resolve()} is not writable; {hint}")


def check_output_path(path: Path) -> None:
    """Fail before any work when ``path`` cannot be written."""
    if not path.parent.resolve().is_dir():
        raise AtomtrainError(
            f"{path}: directory {path.parent} does not exist; create it or choose another path"
        )
    if path.is_dir():
        raise AtomtrainError(f"{path} is a directory; give a file name")
    check_writable_directory(
        path.parent.resolve(), f"give {path.name} a path in a directory you can write to"
    )
