"""distributed.check_consistency_every: ranks holding different parameters are caught,
with a real two-process gloo group."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

SCRIPT = textwrap.dedent(
    """
    import datetime, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from helpers import small_model
    from atomtrain.distributed import Context
    from atomtrain.training.loop import check_same_parameters
    from atomtrain.training.stopping import ParametersDiverged

    rank, port, perturb = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=30))
    context = Context(rank=rank, world_size=2)
    model = small_model([1, 8])
    if perturb and rank == 1:
        with torch.no_grad():
            next(model.parameters()).view(-1)[3] += 1e-12
    try:
        check_same_parameters(context, model, step=7)
        print("agree")
    except ParametersDiverged as error:
        print("diverged:", error)
    dist.destroy_process_group()
    """
)


def run_pair(perturb: bool) -> list[str]:
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    script = SCRIPT.format(tests=str(ROOT / "tests"))
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(rank), str(port), "1" if perturb else "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0].strip() for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    return outputs


@pytest.mark.parametrize("perturb", [False, True])
def test_consistency_check(perturb):
    outputs = run_pair(perturb)
    if perturb:
        assert all(
            output.startswith("diverged: parameters differ between ranks at step 7")
            for output in outputs
        ), outputs
    else:
        assert outputs == ["agree", "agree"]
