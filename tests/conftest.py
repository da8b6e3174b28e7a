from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
RESOURCES = ROOT / "tests" / "resources"
EXAMPLES = ROOT / "examples"

# The suite starts hundreds of Python processes that import atomtrain (runs, ranks, engines,
# examples). Where the environment sets PYTHONDONTWRITEBYTECODE (this machine does), each
# compiles atomtrain's sources again: 0.15 s a process.
# Bytecode is cached as Python does by default (__pycache__ is git-ignored).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The data files the suite reads are kept in a data cache of its own (data/remembered.py),
# which its runs and engines share, and not in the user's.
if "ATOMTRAIN_DATA_CACHE" not in os.environ:
    os.environ["ATOMTRAIN_DATA_CACHE"] = tempfile.mkdtemp(prefix="atomtrain-data-cache-")
    atexit.register(shutil.rmtree, os.environ["ATOMTRAIN_DATA_CACHE"], ignore_errors=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist with ``--dist loadgroup`` (README's command), each test file
    runs whole on one worker, so that its module fixtures (trained runs, most of a
    file's time) are made once, not once per worker; the tests that run SLURM jobs
    (mark ``slurm``) share one worker, since each job takes both CPUs of the cluster
    that .ci/setup_slurm.sh starts, and a second would wait for the first. Files with
    more slow tests go first."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    # the workers take groups in the items' order as they finish: the heaviest first (by
    # their tests of 5 s or more), so that the last to run are short and no worker waits
    # long for the others at the end
    groups, weight, first = {}, {}, {}
    for position, item in enumerate(items):
        group = "slurm" if item.get_closest_marker("slurm") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item] = group
        weight[group] = weight.get(group, 0) + bool(item.get_closest_marker("slow"))
        first.setdefault(group, position)
    items.sort(key=lambda item: (-weight[groups[item]], first[groups[item]]))


@pytest.fixture
def resources() -> Path:
    return RESOURCES


@pytest.fixture
def fixed_threads(monkeypatch):
    """Two threads for the whole test, for runs compared to the last bit: a reduction
    split over another number of threads rounds differently, and on a busy machine
    atomtrain follows the load with its thread count unless OMP_NUM_THREADS fixes it
    (runtime.BusyCores)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)
