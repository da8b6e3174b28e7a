"""keep_freed_memory: glibc's malloc keeps a step's freed memory, unless the user chose."""

from __future__ import annotations

import platform

import pytest

from atomtrain.runtime import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_glibc_accepts_the_settings():
    # mallopt refuses values out of range (0): both must have been taken
    assert keep_freed_memory({})


@pytest.mark.parametrize(
    "environment",
    [
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_MAX_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
    ],
)
def test_the_users_allocator_settings_are_kept(environment):
    assert not keep_freed_memory(environment)
