"""Thin command-line layer: parse, call the library, return an exit code."""

import os

# c10d prints C++ stack traces for every failed connection attempt; atomtrain reports
# such failures itself in one line naming host:port. TORCH_CPP_LOG_LEVEL=INFO shows them.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
