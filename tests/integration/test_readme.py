"""README's commands work as written: the quick start's model serves the Python example
unchanged."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from atomtrain.cli.main import main

from conftest import EXAMPLES, RESOURCES, ROOT
from helpers import write_options

README = (ROOT / "README.md").read_text()


def test_python_example_runs_after_the_quick_start(tmp_path):
    quick_start = re.search(r"```bash\n(.*?)\n```", README, re.S).group(1)
    assert "cd examples/ethanol && atomtrain train options.yaml -o model.pt" in quick_start
    snippet = re.search(r"```python\n(.*?)\n```", README, re.S).group(1)
    # the quick start's training, made small: a model of the ethanol example's elements
    # at examples/ethanol/model.pt, beside the example's data
    options = write_options(tmp_path, RESOURCES / "ethanol_40.xyz")
    assert (
        main(
            [
                "train",
                str(options),
                "--run-dir",
                str(tmp_path / "run"),
                "-o",
                str(tmp_path / "model.pt"),
            ]
        )
        == 0
    )
    shutil.copy(EXAMPLES / "ethanol" / "ethanol_1000.xyz", tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    energy = float(result.stdout.split()[0])
    assert -5000 < energy < -3000  # ethanol's energy in eV, from the model


def test_ci_runs_readmes_test_command():
    """CI's script ends with the test command README gives, so that the suite a reader
    runs (three workers, each test file whole on one) is the one CI times."""
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    install_and_test = blocks[1]
    command = install_and_test.split("&&")[-1].strip()
    assert command.startswith("python3 -m pytest")
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command
