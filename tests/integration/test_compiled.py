"""The compiled training step (architecture.training.compile) in whole runs, through
inductor's code generation: it trains the eager run's model, resumes exactly, and a
model it cannot compile is one line in the log (auto) or one line and exit code 2
(true). The runs train on silicon with stress, and with one thread: inductor's cache
is per thread count, and the two-process run (a thread each) then starts warm."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch

from atomtrain.cli.main import main
from atomtrain.training import compiled as compiled_module

from conftest import RESOURCES
from helpers import environment, finish, run_directories, write_options

ETHANOL = RESOURCES / "ethanol_40.xyz"
SILICON = RESOURCES / "si_test.xyz"  # 25 cells of 63 atoms, with stress


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


def train(directory, compile_option, *extra, **changes):
    directory.mkdir(parents=True, exist_ok=True)
    options = write_options(
        directory,
        SILICON,
        architecture__training__compile=compile_option,
        architecture__training__num_epochs=2,
        **changes,
    )
    code = main(["train", str(options), "--outputs", str(directory / "outputs"), *extra])
    runs = run_directories(directory / "outputs")
    return code, runs[-1] if runs else None


def weights(run):
    return torch.load(run / "last.ckpt", weights_only=True)["model_state"]


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """A compiled run of two epochs, float64, with stress, with a checkpoint after
    each."""
    directory = tmp_path_factory.mktemp("compiled")
    code, run = train(directory, True, architecture__training__checkpoint_interval=1)
    assert code == 0
    return run


def test_a_compiled_run_trains_the_eager_runs_model_and_resumes_exactly(tmp_path, compiled_run):
    """float64: the final weights of two epochs within 1e-8 of the eager run's; and
    resumed after its first epoch in a new process (which compiles again), the
    compiled run ends with the same weights (to 1e-12, as an eager resume)."""
    code, eager_run = train(tmp_path / "eager", False)
    assert code == 0
    log = (compiled_run / "train.log").read_text()
    assert "compiled the training step for batches of any size" in log
    eager, compiled = weights(eager_run), weights(compiled_run)
    for name, value in eager.items():
        if value.is_floating_point():
            scale = float(value.abs().max()) or 1.0
            assert float((compiled[name] - value).abs().max()) <= 1e-8 * scale, name
    # --restart auto of a copy of the run whose last checkpoint is its first epoch's
    copy = tmp_path / "resumed" / "outputs" / "2000-01-01" / "00-00-00"
    copy.mkdir(parents=True)
    (copy / "last.ckpt").write_bytes((compiled_run / "epoch_1.ckpt").read_bytes())
    options = tmp_path / "resumed" / "options.yaml"
    options.write_text((compiled_run / "options.yaml").read_text())
    outputs = str(tmp_path / "resumed" / "outputs")
    assert main(["train", str(options), "--outputs", outputs, "--restart", "auto"]) == 0
    resumed = weights(copy)
    worst = max(
        float((resumed[n] - v).abs().max() / v.abs().max().clamp_min(1e-300))
        for n, v in compiled.items()
        if v.is_floating_point()
    )
    assert worst <= 1e-12, worst  # as an eager resume (tests/integration/test_cli.py)


def fail_to_trace(*_, **__):
    raise compiled_module.CompilationFailed("RuntimeError: an operator inductor cannot take")


def test_a_model_that_cannot_be_compiled_trains_eagerly_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_module.TracedStep, "trace", fail_to_trace)
    # auto, as on a run long enough to repay compiling
    monkeypatch.setattr(compiled_module, "compile_decision", lambda *_: (True, "auto"))
    code, run = train(tmp_path, "auto")
    assert code == 0
    log = (run / "train.log").read_text()
    lines = [line for line in log.splitlines() if "could not be compiled" in line]
    assert len(lines) == 1
    assert "so it runs eagerly: RuntimeError: an operator inductor cannot take" in lines[0]
    assert "epoch 2/2" in log


def test_auto_says_in_the_log_why_a_run_stays_eager(tmp_path):
    code, run = train(tmp_path, "auto")
    assert code == 0
    log = (run / "train.log").read_text()
    assert "steps is shorter than the 50000 that repay compiling SOAP-BPNN)" in log


def test_compile_true_on_a_model_that_cannot_be_compiled_is_one_line_and_exit_2(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(compiled_module.TracedStep, "trace", fail_to_trace)
    code, _ = train(tmp_path, True)
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "the training step could not be compiled (RuntimeError: an operator" in error[0]
    assert "compile: false" in error[0]


@pytest.mark.parametrize("option", ["auto", "sometimes"])
def test_the_compile_option_takes_auto_true_and_false_only(tmp_path, option, capsys):
    options = write_options(tmp_path, ETHANOL, architecture__training__compile=option)
    code = main(["train", str(options), "--check", "--outputs", str(tmp_path / "outputs")])
    if option == "auto":
        assert code == 0
    else:
        assert code == 2
        assert "architecture.training.compile" in capsys.readouterr().err


@pytest.mark.slow
def test_two_compiled_processes_train_the_one_process_model(tmp_path, compiled_run):
    """--nproc 2 with the compiled step (each process compiles its own) against one
    process, float64: within 1e-8, as eager runs are (test_distributed)."""
    code, two = train(
        tmp_path / "two", True, "--nproc", "2", architecture__training__checkpoint_interval=1
    )
    assert code == 0
    assert "compiled the training step" in (two / "train.log").read_text()
    expected, found = weights(compiled_run), weights(two)
    for name, value in expected.items():
        if value.is_floating_point():
            scale = float(value.abs().max()) or 1.0
            assert float((found[name] - value).abs().max()) <= 1e-8 * scale, name


# a compiler that takes two minutes (as MACE's cold compilation may), in Python so that a
# signal's handler runs; it marks the file given first when it starts
SLOW_COMPILER_RUN = """
import sys, time
from pathlib import Path
from torch._inductor import compile_fx

def slow(graph, example_inputs):
    Path(sys.argv[1]).touch()
    end = time.monotonic() + 120
    while time.monotonic() < end:
        time.sleep(0.05)
    raise AssertionError("the compilation was not given up")

compile_fx.compile_fx = slow
from atomtrain.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_stop_during_the_compilation_checkpoints_without_waiting_for_it(tmp_path):
    """SIGTERM while the step compiles (a scheduler waits 30-120 s before it kills; a
    cold compilation of MACE takes a minute): the compilation is given up, the step
    runs eagerly, and its checkpoint is written at once."""
    options = write_options(tmp_path, ETHANOL, architecture__training__compile=True)
    marker, run = tmp_path / "compiling", tmp_path / "run"
    command = [sys.executable, "-c", SLOW_COMPILER_RUN, str(marker)]
    process = subprocess.Popen(
        [*command, "train", str(options), "--run-dir", str(run)],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the compilation did not begin"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    ((code, _, error),) = finish([process], limit=60)
    waited = time.monotonic() - signalled
    assert code == 75, error[-2000:]
    assert "training stopped by SIGTERM at epoch 1, step 1" in error
    assert waited < 60  # not the compilation's 120 s
    log = (run / "train.log").read_text()
    assert (
        "SIGTERM arrived during the compiled training step or its compilation, which was given up"
        in log
    )
    state = torch.load(run / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) == (0, 1)


def test_static_shapes_pad_batches_to_a_few_graphs_compiled_for_cuda_graphs():
    """The path a GPU takes (CUDA graphs, which replay one shape each), here on the CPU,
    where inductor skips the CUDA graphs and everything else is the same: ten batches
    of ethanol with five numbers of pairs run through two graphs, each compiled once,
    for its exact sizes, with torch.compile's reduce-overhead options on; padding
    changes no prediction nor gradient (float64, 1e-10). AOT autograd stands for
    inductor's code generation, as in the architectures' compiled check."""
    import ase.io
    from torch._dynamo.backends.debugging import aot_eager
    from torch._inductor import config as inductor_config

    from atomtrain.data import collate
    from atomtrain.models.registry import new_model
    from atomtrain.training.evaluation import predict

    from helpers import structure_from_atoms

    cutoff = 3.5  # pairs of a molecule within it vary from conformer to conformer
    model = new_model(
        "soap_bpnn",
        [1, 6, 8],
        cutoff,
        soap={"cutoff": {"radius": cutoff, "width": 0.5}, "max_radial": 2, "max_angular": 2},
        bpnn={"num_hidden_layers": 1, "num_neurons_per_layer": 8},
    ).set_precision(torch.float64)
    compilations = []

    def compiler(graph, example_inputs):
        # the sizes dynamo traced the graph with: symbols where compiled for any size
        values = [node.meta["example_value"] for node in graph.graph.find_nodes(op="placeholder")]
        sizes = [size for value in values for size in getattr(value, "shape", [value])]
        compilations.append((inductor_config.triton.cudagraphs, sizes))
        return aot_eager(graph, example_inputs)

    compiled = compiled_module.CompiledPredictions(
        model, True, False, required=True, compiler=compiler, static_shapes=True
    )
    structures = [structure_from_atoms(atoms) for atoms in ase.io.read(ETHANOL, ":")]
    parameters = list(model.parameters())
    pair_counts = set()
    for first in range(0, len(structures), 4):
        batch = collate(structures[first : first + 4], cutoff).to("cpu", torch.float64)
        pair_counts.add(int(batch.pair_first.shape[0]))
        found = {}
        for label, predictions in (
            ("eager", predict(model, batch, True, False, True)),
            ("compiled", compiled(batch)),
        ):
            loss = (predictions["energy"] ** 2).sum() + 0.7 * (predictions["forces"] ** 2).sum()
            gradients = torch.autograd.grad(loss, parameters)
            found[label] = [predictions["energy"].detach(), predictions["forces"].detach()]
            found[label] += list(gradients)
        for eager, static in zip(found["eager"], found["compiled"]):
            assert eager.shape == static.shape
            assert float((static - eager).abs().max()) <= 1e-10 * float(eager.abs().max())
    assert len(pair_counts) == 5
    assert compiled.eager_batches == 0 and compiled.failed is None
    assert compiled.dynamic is None and len(compiled.shaped.graphs) == 2
    assert compiled.compilations == 2
    # each compiled with CUDA graphs asked for (dynamo's retried analysis of its first
    # graph calls the compiler once more), for sizes that are numbers, not symbols
    assert {cuda_graphs for cuda_graphs, _ in compilations} == {True}
    assert all(isinstance(size, int) for _, sizes in compilations for size in sizes)
