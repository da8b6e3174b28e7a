"""i-PI's metatomic driver, with TorchScript's shape specializations left out where no
GPU is present: the profiling executor makes them on a model's first calls in order to
fuse operators, and on a CPU it fuses none, so they only cost time (10 s of a MACE
model's first steps here; docs/engines.md). Used by run.sh as

    i-pi-py_driver -m custom -P metatomic_driver.py -o template=...,model=...

and otherwise i-PI's own driver (``-m metatomic``), unchanged."""

import warnings

import torch
from ipi.pes.metatomic import MetatomicDriver

__DRIVER_NAME__ = "metatomic"
__DRIVER_CLASS__ = "MetatomicDriver"
__all__ = ["MetatomicDriver"]

if not torch.cuda.is_available():
    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript's settings
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.set_fusion_strategy([("STATIC", 0), ("DYNAMIC", 0)])
