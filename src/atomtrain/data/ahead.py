"""Data files read alongside a command's own imports.

A file the data cache (remembered.py) does not hold yet is read by ASE's readers: 0.4 s
of their import (ASE's trajectory module brings much of scipy), then about 1 ms a
structure. A training command hands such files to a child process as it starts
(:func:`read_ahead`); the child reads them into the cache while the command imports
torch (1-1.5 s), and the command's own reading waits for the child and finds them there
(remembered.ReadElsewhere; every file is hashed once for the command). The child imports
neither torch nor the trainer. Where it fails (a file ASE cannot read, a cache that
cannot be written), the command reads the file itself and says what is wrong, as
without the child. ``--nproc N``'s launcher does the same and waits for the child
before it starts its processes (:func:`finish_reading`): each then finds the files in
the cache instead of all reading them at once.
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from pathlib import Path

from ..runtime import die_with_parent, note_helper, unimported
from . import remembered
from .conventions import TargetKeys, Units


def read_ahead(sources: list[tuple[Path, TargetKeys, Units]]) -> None:
    """Name the cache's entries of ``sources`` (file, keys, units) for the command's
    readings, and start a child reading those the cache lacks: files it keeps, not
    directories, not read before."""
    folder = remembered.cache_folder()
    if folder is None:
        return
    names = {}
    for path, keys, units in sources:
        name = None if path.is_dir() else remembered.entry_name(path, keys, units)
        if name is not None:
            names[(str(path), keys, units)] = name
    remembered.ReadElsewhere.names = names
    wanted = {name: reading for reading, name in names.items() if not (folder / name).exists()}
    if not wanted:
        return
    process = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    note_helper(process.pid)  # its CPU is the command's own, not another job's
    try:
        process.stdin.write(pickle.dumps((os.getpid(), str(folder), wanted)))
        process.stdin.close()
    except OSError:  # it died at once: the command reads the files itself
        pass
    remembered.ReadElsewhere.process = process
    remembered.ReadElsewhere.written = frozenset(wanted)


def finish_reading() -> None:
    """Wait for the child reading files into the cache, if one was started: processes
    this one starts then find them there."""
    remembered.ReadElsewhere.wait()


def main() -> None:
    parent, folder, wanted = pickle.loads(sys.stdin.buffer.read())
    die_with_parent()  # a command that ends before its reading leaves no reader behind
    if os.getppid() != parent:  # it ended before the request above
        return
    # vesin (close pairs) takes numpy arrays here, and would import torch if it could
    with unimported("torch", "cupy"):
        from .extxyz import read_file
    for name, (path, keys, units) in wanted.items():
        read = functools.partial(read_file, Path(path), keys, units)
        remembered.read_and_keep(Path(folder), Path(folder) / name, read)


if __name__ == "__main__":
    main()
