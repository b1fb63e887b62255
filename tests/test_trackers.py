"""Experiment trackers and metrics rows across attempts, for real: the worker runs twice on one
run folder (2 ranks, then `resume --step` onto 1 rank, which repeats two steps), and what
TensorBoard, W&B (offline mode: no network here) and MLflow (local file store) wrote is read
back with their own readers. One tracker run per clusterfsdp run; secrets stay out of the folder."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from procs import launch, make_run, run_workers, tiny_job_toml, wait

import clusterfsdp
from clusterfsdp.core import ckptfolder, fileio, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import EventKind

SECRET = "sekrit-0123456789abcdef0123456789abcdef01234567"
TRACKED = '[log]\ntrackers = ["tensorboard", "wandb", "mlflow"]\nproject = "proj"\n'


@pytest.fixture(scope="module")
def two_attempts(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module) -> runfolder.RunFolder:
    """Attempt 0: steps 1-6 on 2 ranks, checkpoints at 4 and 6. Then, as `resume --step 4` does,
    step 6 is set aside and the job is raised to 8 steps: attempt 1 runs steps 5-8 on 1 rank."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_API_KEY": SECRET, "WANDB_SILENT": "true"}.items():
        monkeypatch_module.setenv(key, value)
    monkeypatch_module.delenv("MLFLOW_TRACKING_URI", raising=False)
    tmp = tmp_path_factory.mktemp("trackers")
    job = tiny_job_toml("tracked", seed=3, steps=6, tail=TRACKED + "[checkpoint]\nevery_steps = 4\n")
    run = make_run(job, tmp / "runs")
    run_workers(run, world=2, job_id="a0")
    root = run.checkpoints_dir()
    ckptfolder.keep_only_up_to(root, 4)
    fileio.atomic_write(run.job_toml, S.dumps(run.spec(["train.steps=8"]), redact=True))
    run_workers(run, world=1, job_id="a1")
    return run


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_metrics_rows_carry_the_attempt_and_elapsed_time_continues(two_attempts):
    rows = two_attempts.metrics()
    assert [(r["attempt"], r["step"]) for r in rows] == [(0, s) for s in range(1, 7)] + [(1, s) for s in range(5, 9)]
    by = {(r["attempt"], r["step"]): r for r in rows}
    # elapsed_s goes on from the checkpoint the attempt resumed from (step 4), not from zero
    assert by[(1, 5)]["elapsed_s"] > by[(0, 4)]["elapsed_s"] > 0
    latest = two_attempts.metrics(latest=True)
    assert [r["step"] for r in latest] == list(range(1, 9))
    assert [r["attempt"] for r in latest] == [0] * 4 + [1] * 4
    elapsed = [r["elapsed_s"] for r in latest]
    assert elapsed == sorted(elapsed)
    starts = [e for e in two_attempts.events() if e.event is EventKind.START]
    assert [(e.job_id, e.attempt) for e in starts] == [("a0", 0), ("a1", 1)]


def test_metrics_frame_drops_the_repeated_steps(two_attempts):
    frame = clusterfsdp.metrics_frame(two_attempts)
    assert list(frame.index) == list(range(1, 9)) and list(frame["attempt"]) == [0] * 4 + [1] * 4
    assert frame.loc[5, "loss"] == next(r["loss"] for r in two_attempts.metrics() if r["attempt"] == 1)
    everything = clusterfsdp.metrics_frame(two_attempts.path, latest=False)
    assert len(everything) == 10 and str(everything["time"].dtype).startswith("datetime64")


def test_tensorboard_one_log_dir_with_steps_continuing(two_attempts):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert [p.name for p in two_attempts.path.iterdir() if p.name.startswith("tensorboard")] == ["tensorboard"]
    assert len(list(two_attempts.tensorboard_dir.glob("events.out.tfevents.*"))) == 2  # one file per attempt
    acc = EventAccumulator(str(two_attempts.tensorboard_dir))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 9))  # attempt 0's steps 5 and 6 were purged
    latest = {r["step"]: r for r in two_attempts.metrics(latest=True)}
    assert [e.value for e in loss] == pytest.approx([latest[s]["loss"] for s in range(1, 9)], rel=1e-6)
    assert [e.value for e in acc.Scalars("train/attempt")] == [0] * 4 + [1] * 4
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")  # the job spec, as hparams


def _wandb_records(path: str) -> list:
    """Records of a W&B transaction log (.wandb): LevelDB's log format after a 7-byte header
    (":W&B", magic 0xBEE1, version 0); record = crc32c(4) length(2) type(1) data."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    out, chunks, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf)
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def test_wandb_resumes_one_run_id_with_its_files_in_the_run_folder(two_attempts):
    ids = json.loads(two_attempts.trackers_file.read_text())
    run_id = ids["wandb_run_id"]
    logs = sorted(glob.glob(str(two_attempts.path / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert [Path(p).name for p in logs] == [f"run-{run_id}.wandb"] * 2
    history = []
    for path in logs:
        records = _wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_id == run_id and run.project == "proj" and run.display_name == two_attempts.id
        for r in records:
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.append((items["train/attempt"], items["train/step"]))
    assert history == [(0, s) for s in range(1, 7)] + [(1, s) for s in range(5, 9)]


def test_mlflow_one_run_whose_metric_history_continues(two_attempts):
    from mlflow.tracking import MlflowClient

    ids = json.loads(two_attempts.trackers_file.read_text())
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(tracking_uri=(two_attempts.path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("proj")
    assert experiment is not None and experiment.experiment_id == ids["mlflow_experiment_id"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == ids["mlflow_run_id"] and run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "6" and run.data.tags["clusterfsdp.attempt"] == "1"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == sorted([*range(1, 7), *range(5, 9)])


def test_no_secret_reaches_the_run_folder_and_no_env_reaches_the_trackers(two_attempts):
    found = subprocess.run(["grep", "-rl", SECRET, str(two_attempts.path)], capture_output=True, text=True)
    assert found.stdout == ""
    from clusterfsdp.worker.trackers import hyperparameters

    params = hyperparameters(S.loads(tiny_job_toml("x", 1, 2, tail='[env]\nWANDB_API_KEY = "k"\nFOO = "bar"\n')))
    assert params["train.steps"] == 2 and params["slurm.container.kind"] == "none"
    assert not [k for k in params if k.startswith("env")]


def test_a_tracker_that_cannot_start_stops_every_rank_before_training(tmp_path):
    run = make_run(tiny_job_toml("bad", 1, 2, tail='[log]\ntrackers = ["wandb"]\n'), tmp_path / "runs")
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2, "b0", {"WANDB_MODE": "no-such-mode"}))
    assert [code != 0 for code, _ in out] == [True, True]
    assert "log.trackers: wandb.init failed" in out[0][1] and "rank 0 did not start this attempt" in out[1][1]
    assert not run.metrics_file.exists()


def test_every_tracker_the_schema_accepts_has_an_entry_and_an_unknown_one_is_refused(tmp_path):
    """`worker.trackers.TRACKERS` (one entry per tracker module) holds exactly the names the
    schema accepts, and a name without an entry (a spec built past the schema's check) is a
    TrackerError naming it, before any tracker starts: it was once taken for MLflow."""
    from typing import get_args

    from clusterfsdp.core.records import Executor
    from clusterfsdp.core.spec import Tracker
    from clusterfsdp.worker.trackers import TRACKERS, TrackerError, Trackers

    assert set(TRACKERS) == set(get_args(Tracker))
    spec = S.loads(tiny_job_toml("unknown", 1, 2), [f"job.run_root={tmp_path}"])
    spec.log.trackers = ["tensorboardx"]  # pyright: ignore[reportAttributeAccessIssue] (past the schema)
    run = runfolder.create_run(spec, Executor.LOCAL, "20260101-120000-trkr")
    with pytest.raises(TrackerError, match=r"^log.trackers: no tracker is named 'tensorboardx' \(known: "):
        Trackers.open(run, spec, 0, print)
    assert not (run.path / "mlruns").exists()
