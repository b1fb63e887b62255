"""Tokenizing as a Slurm job array of its own (control/prepjob.py, data/array.py), through the
real daemons of the local test cluster: a 2-node array gives the bytes of a local prepare and
a task killed mid-way is finished by a rerun without redoing its complete units; `submit` of a
job whose data is not prepared queues the array first and the training job after it (bad input
cancels the training job with the file and line in `status` and `doctor`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from data_helpers import documents, job, write_jsonl
from slurm_fixtures import bounded
from test_prepare_array import dataset_bytes

from clusterfsdp.control import doctor, status
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.lock import FileLock
from clusterfsdp.data import array, arraystate, cache
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.units import plan, unit_size

pytestmark = pytest.mark.slurm
ONE_WORKER = ("--set", "data.prepare_workers=1")  # a pool of processes costs its imports; test_dataprep covers it


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True, timeout=bounded(timeout)
    )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + bounded(timeout)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def corpus(path: Path, megabytes: int) -> Path:
    """A .jsonl of about `megabytes` MB: units of 1 MiB (unit_size), several per task."""
    docs = [{"text": d} for d in documents(400)]
    one = sum(len(json.dumps(r)) + 1 for r in docs)
    return write_jsonl(path, docs * (megabytes * 1_000_000 // one + 1))


def test_a_two_node_array_is_the_local_prepare_and_a_killed_task_is_finished_by_a_rerun(slurm_cluster, tmp_path):
    """A 2-task array over the 2 nodes. This process claims task 1's last unit first (another
    prepare on another host, for the tasks): task 1 tokenizes its other units and waits for that
    one, task 0 does its share and leaves the dataset to the last task; task 1 is then cancelled
    mid-way. The rerun array tokenizes that unit only, completes the dataset, and its bytes are
    those of a local prepare."""
    path = corpus(tmp_path / "d.jsonl", 8)
    spec = job(tmp_path, [path], "bytes", "data.prepare_workers=1", "slurm.time=10")
    job_file = tmp_path / "job.toml"
    job_file.write_text(S.dumps(spec))
    (ref,) = cache.dataset_refs(spec)
    unit_bytes = unit_size(path.stat().st_size)
    units = len(list(plan(ref.sources, spec.data, ref.root, unit_bytes)))
    last = units - 1 if (units - 1) % 2 else units - 2  # task 1's last unit
    array.open_partial(ref, unit_bytes, array.LOCAL)
    claim = FileLock(arraystate.claims_dir(ref) / f"{last:05d}.lock", "the test", heartbeat_s=5).acquire()

    r = cli("data", "prepare", str(job_file), "--executor", "slurm", "--nodes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    array_id = r.stdout.split("array job ")[1].split()[0]
    slurm_cluster.wait_sacct(f"{array_id}_0", "COMPLETED", 120)
    shards = ref.partial / "shards"
    others = {f"{i:05d}" for i in range(units) if i != last}
    wait_for(lambda: {p.stem for p in shards.glob("[0-9]*.json")} == others, 120, "every unit but the claimed one")
    assert slurm_cluster.squeue_state(f"{array_id}_1") == "RUNNING"  # waiting for the claimed unit
    slurm_cluster.run(["scancel", f"{array_id}_1"])
    slurm_cluster.wait_sacct_rows(
        f"{array_id}_1", lambda rows: bool(rows) and rows[-1].startswith("CANCELLED"), "task 1 cancelled", 60
    )
    hosts = set(slurm_cluster.run(["sacct", "-n", "-X", "-P", "-j", array_id, "-o", "NodeList"]).stdout.split())
    assert hosts == {"node1", "node2"}, hosts
    assert ref.manifest() is None
    st = cli("data", "status", str(job_file))
    assert f"train: preparing, {units - 1} of {units} units" in st.stdout, st.stdout
    kept = {p.stem: os.stat(p.with_suffix(".tok")).st_mtime_ns for p in shards.glob("[0-9]*.json")}
    claim.release()

    again = cli("data", "prepare", str(job_file), "--executor", "slurm", "--nodes", "2", "--follow", timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "train: prepared" in again.stdout
    for name, mtime in kept.items():  # the finished units were not tokenized again
        assert os.stat(ref.folder / "shards" / f"{name}.tok").st_mtime_ns == mtime, name

    local = job(tmp_path, [path], "bytes", cache=tmp_path / "local")
    (mine,) = dataprep.ensure(local, workers=1)
    assert mine.key == ref.key and dataset_bytes(mine) == dataset_bytes(ref)


def test_submit_queues_the_prepare_array_first_and_bad_input_cancels_the_training_job(
    slurm_cluster, tiny_job, tmp_path
):
    root = tmp_path / "runs"
    # bad input: a broken JSON line in the middle of the file
    bad = corpus(tmp_path / "bad.jsonl", 3)
    lines = bad.read_bytes().split(b"\n")
    lines[len(lines) // 2] = b'{"text": "unterminated'
    bad.write_bytes(b"\n".join(lines))
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", f"data.paths=['{bad}']", *ONE_WORKER)
    assert r.returncode == 0, r.stdout + r.stderr
    (failed,) = runfolder.list_runs(root)
    message = f"{bad}:{len(lines) // 2 + 1}: not valid JSON"
    wait_for(lambda: status.run_status(failed).state == "CANCELLED", 120, "the training job cancelled", 1)
    st = status.run_status(failed)
    assert "data prepare job" in st.reason and message in st.reason, st.reason
    # doctor: the prepare's own failure (the file and line) is the cause, not "nothing ran yet"
    found = doctor.diagnose(failed, st.events, st.state.live, st.state, st.reason)
    assert found.finding is doctor.Finding.DATA_ERROR and message in found.summary, found
    shown = cli("doctor", str(failed.path)).stdout
    assert "cause      data_error: data prepare job" in shown and message in shown, shown
    assert "where      job " in shown and ".None" not in shown and "nothing ran yet" not in shown, shown
    assert not any(p.is_dir() and not p.name.startswith(".") for p in (root / ".cache" / "tokens").iterdir())

    good = corpus(tmp_path / "good.jsonl", 6)
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        f"data.paths=['{good}']",
        "--set",
        "train.steps=10",
        *ONE_WORKER,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run = next(x for x in runfolder.list_runs(root) if x.id != failed.id)
    prepare_id = json.loads((run.path / "prepare.json").read_text())["job_id"]
    assert f"waits for data prepare job {prepare_id}" in r.stderr, r.stderr
    waiting = status.run_status(run)
    assert waiting.state == "PENDING" and waiting.reason.startswith("waiting for data prepare job"), waiting.reason
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 300, "the training run", 1)
    assert slurm_cluster.wait_sacct(prepare_id, "COMPLETED")  # one task (slurm.nodes = 1): a plain job
    assert max(row["step"] for row in run.metrics()) == 10
