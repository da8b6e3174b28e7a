"""The layout of a memory-mapped data directory as atomtrain writes it: the manifest
(format version, checksums), atomtrain's optional files, and the check a reader makes
of them. Read by both the writer (convert.py) and the reader (memmap.py), so that
neither imports the other."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

logger = logging.getLogger(__name__)

MANIFEST = "atomtrain.json"
FORMAT = "atomtrain-memmap-1"


@dataclass(frozen=True)
class Layout:
    """atomtrain's optional files: float64 copies, pair counts for these cutoffs."""

    float64: bool = False
    cutoffs: tuple[float, ...] = ()


PAIRS_PREFIX = "atomtrain_pairs_"


def pairs_file(cutoff: float) -> str:
    """The file of the pair counts for ``cutoff``: the prefix, repr(cutoff), .bin."""
    return f"{PAIRS_PREFIX}{float(cutoff)!r}.bin"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# Every start verifies the directory against its manifest. Up to this many bytes it
# hashes every byte (1 GB: about a second); beyond, it checks every file's size and
# the hash of SAMPLED_BLOCKS blocks spread over each file, so that start-up does not
# grow with the data (a million 64-atom cells are 1.9 GB, 2.2 s to hash in full; a
# hundred million, 190 GB). A change of values that keeps sizes and misses the samples
# goes unseen by this check; NaN or infinite values then stop the run at their step.
FULLY_VERIFIED_BYTES = 1 << 30
SAMPLED_BLOCKS = 64
SAMPLED_BLOCK_BYTES = 1 << 16


def sampled_sha256(path: Path) -> str:
    """SHA-256 of SAMPLED_BLOCKS blocks at evenly spaced offsets of ``path`` (all of it
    when it is smaller)."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        if size <= SAMPLED_BLOCKS * SAMPLED_BLOCK_BYTES:
            digest.update(stream.read())
            return digest.hexdigest()
        last = size - SAMPLED_BLOCK_BYTES
        for block in range(SAMPLED_BLOCKS):
            stream.seek(last * block // (SAMPLED_BLOCKS - 1))
            digest.update(stream.read(SAMPLED_BLOCK_BYTES))
    return digest.hexdigest()


def check_manifest(directory: Path) -> dict | None:
    """The manifest of a directory atomtrain wrote (None for other directories),
    refused in one line when another format version wrote it or when a file no longer
    has the size or checksum it was written with (all bytes, or sampled blocks of a
    large directory: see FULLY_VERIFIED_BYTES)."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise DataError(f"{path}: not readable JSON ({error})") from error
    written = manifest.get("format", "")
    if written != FORMAT:
        raise DataError(
            f"{path}: data directory format '{written}', this atomtrain reads '{FORMAT}'; "
            "convert the data again with this version (atomtrain convert) or update atomtrain"
        )
    changed = [name for name, same in verify_files(directory, manifest).items() if not same]
    if changed:
        raise DataError(
            f"{directory}: {', '.join(changed)} changed since atomtrain convert wrote them "
            f"(SHA-256 differs from {MANIFEST}); convert the data again"
        )
    return manifest


def verify_files(directory: Path, manifest: dict) -> dict[str, bool]:
    """Whether each file of the manifest is still as written: its size, then its full
    SHA-256, or its sampled one for a large directory. Manifests written before sizes
    and samples were recorded are verified in full."""
    digests: dict[str, str] = manifest.get("files", {})
    sizes: dict[str, int] = manifest.get("sizes", {})
    sampled: dict[str, str] = manifest.get("sampled_sha256", {})
    recorded = all(name in sizes and name in sampled for name in digests)

    def same_size(name: str) -> bool:
        path = directory / name
        return path.is_file() and (not recorded or path.stat().st_size == sizes[name])

    total = sum(sizes[name] for name in digests) if recorded else 0
    if not recorded or total <= FULLY_VERIFIED_BYTES:
        return {
            name: same_size(name) and sha256(directory / name) == digests[name] for name in digests
        }
    logger.info(
        f"{directory}: {total / 1e9:.1f} GB; verified the size of every file and "
        f"{SAMPLED_BLOCKS} sampled blocks of each against {MANIFEST}"
    )
    return {
        name: same_size(name) and sampled_sha256(directory / name) == sampled[name]
        for name in digests
    }
