from __future__ import annotations

import os
import sys
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
