"""Two "nodes" as two Linux network namespaces joined by a veth pair: training works
across them, and cutting the link makes both sides exit within the timeout, naming the
unreachable peer. Needs root and iproute2."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest
import torch

from test_faults import environment, finish, options_in, train_command, wait_for_epochs

ADDRESS_A, ADDRESS_B = "10.231.77.1", "10.231.77.2"


def can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"atprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return made


pytestmark = pytest.mark.skipif(
    not can_make_namespaces(), reason="needs root and iproute2 to create network namespaces"
)


def ip(*arguments):
    subprocess.run(["ip", *arguments], check=True, capture_output=True)


@pytest.fixture
def two_nodes():
    tag = uuid.uuid4().hex[:6]
    node_a, node_b = f"ata{tag}", f"atb{tag}"
    link_a, link_b = f"va{tag}", f"vb{tag}"
    ip("netns", "add", node_a)
    ip("netns", "add", node_b)
    try:
        ip("link", "add", link_a, "type", "veth", "peer", "name", link_b)
        ip("link", "set", link_a, "netns", node_a)
        ip("link", "set", link_b, "netns", node_b)
        for node, link, address in ((node_a, link_a, ADDRESS_A), (node_b, link_b, ADDRESS_B)):
            ip("-n", node, "addr", "add", f"{address}/24", "dev", link)
            ip("-n", node, "link", "set", link, "up")
            ip("-n", node, "link", "set", "lo", "up")
        yield (node_a, link_a), (node_b, link_b)
    finally:
        subprocess.run(["ip", "netns", "del", node_a], capture_output=True)
        subprocess.run(["ip", "netns", "del", node_b], capture_output=True)


def start_on_nodes(nodes, command, port):
    processes = []
    for rank, (node, _) in enumerate(nodes):
        env = environment(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS="2",
            SLURM_LOCALID="0",
            SLURM_JOB_NODELIST="nodea",
            MASTER_ADDR=ADDRESS_A,
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        processes.append(
            subprocess.Popen(
                ["ip", "netns", "exec", node, *command],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return processes


@pytest.mark.slow
def test_training_across_namespaces_and_a_cut_link(tmp_path, two_nodes):
    # a complete run across the two nodes
    options = options_in(tmp_path, architecture__training__num_epochs=2, distributed__timeout=5)
    results = finish(start_on_nodes(two_nodes, train_command(options, tmp_path / "ok"), 29611))
    assert [code for code, _, _ in results] == [0, 0], results
    log = (tmp_path / "ok" / "train.log").read_text()
    assert ADDRESS_B in log  # the rank map names the second node's address
    torch.load(tmp_path / "ok" / "last.ckpt", weights_only=True)

    # cut the link while training
    options = options_in(tmp_path, architecture__training__num_epochs=200, distributed__timeout=5)
    run_dir = tmp_path / "cut"
    processes = start_on_nodes(two_nodes, train_command(options, run_dir), 29612)
    wait_for_epochs(run_dir, 1, processes)
    (node_a, link_a), _ = two_nodes
    ip("-n", node_a, "link", "set", link_a, "down")
    start = time.monotonic()
    (code_a, _, error_a), (code_b, _, error_b) = finish(processes, limit=90)
    assert time.monotonic() - start < 45
    assert code_a == 3 and code_b == 3, (error_a[-2000:], error_b[-2000:])
    assert "lost rank 1 on" in error_a and ADDRESS_B in error_a
    assert "lost contact with rank 0" in error_b and ADDRESS_A in error_b
    assert "Traceback" not in error_a + error_b
