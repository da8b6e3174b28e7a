from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESOURCES = ROOT / "tests" / "resources"
EXAMPLES = ROOT / "examples"


@pytest.fixture
def resources() -> Path:
    return RESOURCES
