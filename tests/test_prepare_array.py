"""A prepare spread over several processes (the tasks of a Slurm job array, data/array.py): the
tasks' shares give exactly the bytes of a local prepare, a rerun keeps the finished units, two
prepares never write the same unit, and bad input stops every task with its file and line while
nothing half-written is ever used. Real processes, real files, a real BPE tokenizer; the Slurm
side (the array queued through submitit, a killed task, the training job's dependency) is
tests/test_slurm_prepare.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from data_helpers import conversations, documents, job, make_tokenizer, write_jsonl

from clusterfsdp import cli
from clusterfsdp.core import spec as S
from clusterfsdp.core.lock import FileLock
from clusterfsdp.data import array, arraystate, cache
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.sources import DataError
from clusterfsdp.data.units import plan

RUN_DEPENDENT = ("created", "seconds", "cpu_seconds", "workers")  # of a manifest: not content


def dataset_bytes(ref: cache.DatasetRef) -> tuple[dict[str, bytes], dict]:
    """Every shard file's bytes, and the manifest without what differs between any two prepares
    (times, and the seals' inode and ctime)."""
    manifest = ref.manifest()
    assert manifest is not None
    files = {p.name: p.read_bytes() for p in sorted((ref.folder / "shards").iterdir()) if p.suffix != ".json"}
    content = {k: v for k, v in manifest.items() if k not in RUN_DEPENDENT}
    for shard in content["shards"]:
        shard["files"] = {ext: (s["size"], s["xxh3"]) for ext, s in shard["files"].items()}
    return files, content


def complete_units(ref: cache.DatasetRef) -> dict[str, tuple[int, int]]:
    """{shard: (inode, mtime)} of the complete units of a partial folder."""
    shards = ref.partial / "shards"
    return {
        p.stem: (os.stat(p.with_suffix(".tok")).st_ino, os.stat(p.with_suffix(".tok")).st_mtime_ns)
        for p in shards.glob("[0-9]*.json")
    }


def test_two_tasks_in_two_processes_give_the_bytes_of_a_local_prepare(tmp_path):
    """Two `--share I/2` processes at once: the one that finishes last renames the dataset;
    its bytes (token ids, document offsets) are those of a local prepare."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(300)])
    spec = job(tmp_path, [path], "bytes")
    job_file = tmp_path / "job.toml"
    job_file.write_text(S.dumps(spec))
    argv = [sys.executable, "-m", "clusterfsdp.data.prepare", str(job_file), "--workers", "1", "--unit-bytes", "2048"]
    tasks = [
        subprocess.Popen(
            [*argv, "--share", f"{i}/2", "--array", "a1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for i in range(2)
    ]
    outs = [t.communicate(timeout=120)[0] for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0], outs
    assert sum("data: prepared " in out for out in outs) == 1, outs  # one of them finished the dataset
    (ref,) = cache.dataset_refs(spec)
    assert not ref.partial.exists() and sorted(os.listdir(ref.folder)) == [
        "index",
        "manifest.json",
        "plan.json",
        "shards",
    ]
    (mine,) = dataprep.ensure(job(tmp_path, [path], "bytes", cache=tmp_path / "local"), workers=1, unit_bytes=2048)
    got, want = dataset_bytes(ref), dataset_bytes(mine)
    assert mine.key == ref.key and len(got[1]["shards"]) > 4 and got == want


def test_the_shares_of_chat_data_give_the_same_tokens_and_loss_masks(tmp_path):
    """Chat data with a BPE tokenizer (loss masks), prepared as the two tasks of an array, one
    after the other in this process: the same bytes as a local prepare."""
    bpe = make_tokenizer(tmp_path / "bpe")
    path = write_jsonl(tmp_path / "chats.jsonl", conversations(60))
    spec = job(tmp_path, [path], str(bpe), "data.format=chat")
    assert dataprep.run_task(spec, array.Share(0, 2, "a2"), lambda line: None, workers=1, unit_bytes=1024) is False
    assert dataprep.run_task(spec, array.Share(1, 2, "a2"), lambda line: None, workers=1, unit_bytes=1024) is True
    (ref,) = cache.dataset_refs(spec)
    local = job(tmp_path, [path], str(bpe), "data.format=chat", cache=tmp_path / "local")
    (mine,) = dataprep.ensure(local, workers=1, unit_bytes=1024)
    got, want = dataset_bytes(ref), dataset_bytes(mine)
    assert len(got[1]["shards"]) > 2 and any(name.endswith(".msk") for name in got[0]) and got == want


def test_a_task_that_comes_late_finds_the_dataset_complete_and_leaves_it_alone(tmp_path, monkeypatch):
    """A tiny corpus is one unit: task 0 of 2 tokenizes it and renames the dataset into place
    while task 1 is still on its way (on the devcluster task 1 failed with FileNotFoundError on the
    partial folder's claims/ and the training job was cancelled). Task 1 between its look for a
    manifest and the partial folder, and task 1 while it opens the partial folder: both end
    without an error, the dataset untouched and no partial folder made again."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(20)])
    spec = job(tmp_path, [path], "bytes")
    (ref,) = cache.dataset_refs(spec)
    opened = array.trust.mkdirs

    def task0_finishes_meanwhile(folder):  # task 1 is opening the partial folder task 0 renames
        opened(folder)
        if folder.name == "claims":
            monkeypatch.setattr(array.trust, "mkdirs", opened)
            assert dataprep.run_task(spec, array.Share(0, 2, "a9"), lambda _: None, workers=1)

    monkeypatch.setattr(array.trust, "mkdirs", task0_finishes_meanwhile)
    lines: list[str] = []
    array.tokenize_share(ref, spec, lines.append, array.Share(1, 2, "a9"), workers=1, unit_bytes=1 << 20)
    assert ref.manifest() is not None and not ref.partial.exists(), lines
    before = dataset_bytes(ref)
    array.tokenize_share(ref, spec, lines.append, array.Share(1, 2, "a9"), workers=1, unit_bytes=1 << 20)
    assert "data: the train data is prepared (by another task): nothing to do" in lines
    assert not ref.partial.exists() and dataset_bytes(ref) == before
    assert dataprep.run_task(spec, array.Share(1, 2, "a9"), lambda _: None, workers=1) is True


def test_a_rerun_keeps_the_finished_units_and_waits_for_a_unit_another_prepare_holds(tmp_path):
    """Task 0 of 2 alone (task 1 died before it started): its units are complete, the dataset is
    not. A local prepare then keeps those units untouched, leaves alone the unit another live
    prepare has claimed (waiting for it), and completes the dataset once that claim is released."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(200)])
    spec = job(tmp_path, [path], "bytes")
    lines: list[str] = []
    assert dataprep.run_task(spec, array.Share(0, 2, "a1"), lines.append, workers=1, unit_bytes=2048) is False
    (ref,) = cache.dataset_refs(spec)
    kept = complete_units(ref)
    units = json.loads(arraystate.units_file(ref).read_text())["units"]
    assert ref.manifest() is None and sorted(int(s) for s in kept) == list(range(0, units, 2)) and units > 6
    status = arraystate.progress(ref)
    assert status.phase is arraystate.PreparePhase.PREPARING and (status.shards, status.units) == (len(kept), units)

    held = FileLock(arraystate.claims_dir(ref) / "00001.lock", "another prepare (test)").acquire()
    log: list[str] = []
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            dataprep.ensure(spec, log.append, workers=1, unit_bytes=2048)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=prepare)
    t.start()
    deadline = time.time() + 60
    while not any("being tokenized by another prepare" in line for line in log):
        assert t.is_alive() and time.time() < deadline, (log, errors)
        time.sleep(0.05)
    done = complete_units(ref)
    assert "00001" not in done and len(done) == units - 1  # every other unit, none of it twice
    held.release()
    t.join(60)
    assert not t.is_alive() and not errors, errors
    assert f"({len(kept)} shards kept)" in "\n".join(log)
    for name, identity in kept.items():  # the finished units were not tokenized again
        st = os.stat(ref.folder / "shards" / f"{name}.tok")
        assert (st.st_ino, st.st_mtime_ns) == identity, name
    fresh = job(tmp_path, [path], "bytes", cache=tmp_path / "fresh")
    (clean,) = dataprep.ensure(fresh, workers=1, unit_bytes=2048)
    assert dataset_bytes(ref) == dataset_bytes(clean)


def test_bad_input_stops_every_task_with_its_file_and_line_and_nothing_is_used(tmp_path, capsys):
    """A broken JSON line deep in the file, in one task's share: that task fails naming
    file:line, the other one (started later) stops with the same line, `data status` shows it, no dataset is
    renamed into place; a later prepare starts afresh and fails the same way, leaving nothing."""
    records = [{"text": d} for d in documents(200)]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    lines = path.read_bytes().split(b"\n")
    lines[150] = b'{"text": "unterminated'
    path.write_bytes(b"\n".join(lines))
    spec = job(tmp_path, [path], "bytes")
    (ref,) = cache.dataset_refs(spec)
    message = f"{path}:151: not valid JSON"
    at = sum(len(line) + 1 for line in lines[:150])
    bad = next(u.shard for u in plan(ref.sources, spec.data, ref.root, 2048) if u.start <= at < u.stop) % 2
    for index in (bad, 1 - bad):  # the task that reads the line, then the other one
        with pytest.raises(DataError, match=re.escape(message)):
            dataprep.run_task(spec, array.Share(index, 2, "a7"), lambda line: None, workers=1, unit_bytes=2048)
    assert ref.manifest() is None and not ref.folder.exists()
    status = arraystate.progress(ref)
    assert status.phase is arraystate.PreparePhase.FAILED and message in status.line()

    job_file = tmp_path / "job.toml"
    job_file.write_text(S.dumps(spec))
    assert cli.main(["data", "status", str(job_file)]) == 0
    assert f"train: failed: data.paths[0]: {message}" in capsys.readouterr().out

    with pytest.raises(DataError, match=re.escape(message)):  # not a task of that array: a fresh start, the same error
        dataprep.ensure(spec, workers=1, unit_bytes=2048)
    assert not ref.partial.exists() and not ref.folder.exists()


def test_require_refuses_to_submit_unprepared_data(tmp_path, capsys):
    """data.prepare = 'require': neither submit nor the job's rank 0 tokenizes."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(60)])
    job_file = tmp_path / "job.toml"
    job_file.write_text(S.dumps(job(tmp_path, [path], "bytes", "data.prepare=require")))
    assert cli.main(["submit", str(job_file), "--executor", "local"]) == 2
    err = capsys.readouterr().err
    assert "data.prepare = 'require': the train data is not prepared" in err
    assert not list(tmp_path.glob("*/*/state.json"))  # no run folder left behind
    with pytest.raises(DataError, match=r"data\.prepare = 'require': the train data is not prepared"):
        dataprep.ensure(S.load(job_file))  # a job's rank 0 does not prepare it either
