"""Experiment logs (options.logging): TensorBoard event files and an offline W&B run,
read back with tensorboard's own reader and from W&B's run file; a stopped and resumed
run continues the same W&B run; rank 0 alone writes them; missing packages are one
line."""

from __future__ import annotations

import csv
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from atomtrain.cli.main import main

from helpers import environment, run_directories
from test_faults import options_in, stop_then_resume_with_two, train_command

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

EPOCHS = 12  # test_faults' runs
OFFLINE = {"project": "atomtrain-tests", "mode": "offline"}


def tensorboard_scalars(directory: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, dict[int, float]] = {}
    for events in sorted(directory.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            for event in accumulator.Scalars(tag):
                found.setdefault(tag, {})[event.step] = event.value
    return found


def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B run file (a LevelDB-style log: a 7-byte header,
    then 32 KiB blocks of records, each with a 7-byte header: checksum, length, type
    1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        left = block - offset % block
        if left < 7:
            offset += left
            continue
        length, kind = struct.unpack("<HB", data[offset + 4 : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(path: Path, limit_s: float = 60.0) -> list:
    """The records of a run file once its exit record is there: ``run.finish()``
    returns before W&B's service has written the file out (a run in this process, on a
    busy machine, was read without its run and history records)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            records = wandb_records(path)
        except Exception:  # a record written in part
            records = []
        if any(record.WhichOneof("record_type") == "exit" for record in records):
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record after {limit_s} s"
        time.sleep(0.2)


def wandb_history(run_directory: Path) -> tuple[set[str], dict[int, dict]]:
    """(the run ids of the offline runs, their logged rows by epoch)."""
    ids, rows = set(), {}
    for run_file in sorted(run_directory.glob("wandb/offline-run-*/run-*.wandb")):
        for record in finished_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                rows[int(row["epoch"])] = row
    return ids, rows


def train_csv(run_directory: Path) -> list[dict[str, str]]:
    with (run_directory / "train.csv").open() as stream:
        return list(csv.DictReader(stream))


@pytest.mark.slow
def test_a_stopped_and_resumed_run_logs_every_epoch_to_one_wandb_run(tmp_path):
    options = options_in(tmp_path, logging__wandb=OFFLINE, logging__tensorboard=True)
    run_dir = tmp_path / "run"
    stop_then_resume_with_two(options, run_dir, EPOCHS)
    rows = train_csv(run_dir)
    assert len(rows) == EPOCHS
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    ids, history = wandb_history(run_dir)
    assert ids == {(run_dir / "wandb_run_id").read_text().strip()}  # one W&B run
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2  # started, then resumed
    for row in rows:
        epoch = int(row["epoch"])
        for name, value in row.items():
            if name == "epoch":
                continue
            assert scalars[name][epoch] == pytest.approx(float(value), rel=1e-6), name
            assert history[epoch][name] == pytest.approx(float(value), rel=1e-12), name


@pytest.mark.slow
def test_only_rank_0_writes_the_logs(tmp_path):
    options = options_in(tmp_path, architecture__training__num_epochs=2, logging__tensorboard=True)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        train_command(options, run_dir, "--nproc", 2),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert sorted(tensorboard_scalars(run_dir / "tensorboard")["train_loss"]) == [1, 2]


@pytest.mark.slow
def test_metatrains_top_level_wandb_key_is_logging_wandb(tmp_path, capsys):
    options = options_in(
        tmp_path, wandb=OFFLINE, architecture__training__num_epochs=1, logging__tensorboard=True
    )
    outputs = tmp_path / "outputs"
    assert main(["train", str(options), "--outputs", str(outputs)]) == 0
    (run,) = run_directories(outputs)
    ids, history = wandb_history(run)
    assert len(ids) == 1 and sorted(history) == [1]
    assert (
        torch.load(run / "last.ckpt", weights_only=True)["options"]["logging"]["wandb"] == OFFLINE
    )


@pytest.mark.parametrize("package, key", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_a_logger_that_is_not_installed_is_one_line(tmp_path, package, key):
    value = json.dumps(OFFLINE if key == "wandb" else True)
    options = options_in(tmp_path, **{f"logging__{key}": json.loads(value)})
    script = (
        f"import sys; sys.modules[{package!r}] = None\n"
        "from atomtrain.cli.main import main\n"
        f"sys.exit(main(['train', {str(options)!r}, '--check']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and f"pip install atomtrain[{package}]" in error[0]
