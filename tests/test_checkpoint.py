"""DCP checkpoints: bitwise-exact resume, resume on another world size, kill -9 mid-save,
async saves, keep_last, and preemption (SIGUSR2) / cancel (SIGTERM) on the local executor."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from data_helpers import conversations, documents, make_tokenizer, write_jsonl, write_parquet
from procs import launch, make_run, run_workers, tiny_job_toml, wait

from clusterfsdp.control import status
from clusterfsdp.control.run import Run
from clusterfsdp.core import ckptfolder, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import EventKind

JOB = tiny_job_toml(
    "ck",
    seed=5,
    steps=8,
    fsdp='sharding = "full"',
    tail="""
[slurm]
tasks_per_node = 2
[checkpoint]
every_steps = 4
keep_last = 5
""",
)


def newest(run: runfolder.RunFolder) -> ckptfolder.CheckpointInfo:
    found = ckptfolder.find(run.checkpoints_dir())
    assert found is not None, f"no complete checkpoint in {run.checkpoints_dir()}"
    return found


def rows_by_attempt(run: runfolder.RunFolder, key: str = "loss") -> list[dict[int, float]]:
    """metrics.jsonl split where the step goes backwards (a new attempt resumed): step -> `key`."""
    out: list[dict[int, float]] = [{}]
    last = 0
    for r in run.metrics():
        if r["step"] <= last:
            out.append({})
        if key in r:
            out[-1][r["step"]] = r[key]
        last = r["step"]
    return out


def test_the_same_step_set_aside_twice_in_one_second_keeps_both(tmp_path):
    """`resume --step` twice within a second (the resume between made the step again that fast, as
    a forked tiny run does): the second set-aside of step 8 gets the next free second's name; the
    rename onto the first used to fail (ENOTEMPTY), with the checkpoint left in place."""
    root = tmp_path / "checkpoints"
    for text in ("first", "second"):
        (root / "step-00000008").mkdir(parents=True)
        (root / "step-00000008" / "mark").write_text(text)
        ckptfolder.set_aside(root / "step-00000008")
    assert not (root / "step-00000008").exists()
    kept = sorted(ckptfolder.set_aside_steps(root), key=lambda s: s[1].name)
    assert [(step, (path / "mark").read_text()) for step, path in kept] == [(8, "first"), (8, "second")]


# Llama, and a family that is built differently (LayerNorm with biases, two-matrix MLP, partial
# rotary, parallel residual, untied lm_head): random init and resume are family-independent.
FAMILIES = ["llama-tiny", "gpt-neox-tiny"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_resume_is_bitwise_exact_on_the_same_world_size_and_reshards_on_another(tmp_path, preset):
    """From step 4 of a 2-rank run: a resume on 2 ranks repeats steps 5-8 bitwise; one on 1 rank
    (micro-batch 4: the same 4 samples per step) reshards the checkpoint, keeps the data position
    and repeats them within float tolerance."""
    run = make_run(JOB, tmp_path, [f"model.preset={preset!r}"])
    run_workers(run, 2, job_id="a1")
    root = run.checkpoints_dir()
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [4, 8]
    moved = ckptfolder.keep_only_up_to(root, 4)  # what `clusterfsdp resume --step 4` does
    ((original, aside),) = moved
    assert original == root / "step-00000008" and aside.parent.name == "set-aside" and not original.exists()
    run_workers(run, 2, job_id="a2")
    ckptfolder.keep_only_up_to(root, 4)
    # 1 rank x micro-batch 4 = the same 4 samples per step that 2 ranks x 2 saw
    spec = S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.micro_batch_size=4"])
    run.job_toml.write_text(S.dumps(spec))
    out = run_workers(run, 1, job_id="a3")
    first, resumed, resharded = rows_by_attempt(run)
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(resumed[s] == first[s] for s in resumed), (resumed, first)  # bitwise
    assert any(e.event == "resumed" and e.step == 4 and e.job_id == "a2" for e in run.events())
    for step in (5, 6, 7, 8):
        assert resharded[step] == pytest.approx(first[step], abs=2e-4)
    assert "saved by 2 ranks, now 1" in out[0][1]
    final = newest(run)
    assert final.step == 8 and final.meta["consumed"] == 8 * 4 and final.meta["world_size"] == 1


def _data_variant(name: str, folder: Path) -> list[str]:
    """Overrides that put one kind of prepared data under the checkpoint test's job."""
    if name == "documents-zst-heldout":
        path = write_jsonl(folder / "docs.jsonl.zst", [{"text": d} for d in documents(200)])
        return [
            f"data.paths=['{path}']",
            "data.packing='documents'",
            "eval.fraction=0.2",
            "eval.every_steps=4",
            "eval.batches=3",
        ]
    tokenizer = make_tokenizer(folder / "chatml")
    train = write_parquet(folder / "chat.parquet", conversations(200))
    held = write_jsonl(folder / "held.jsonl.gz", conversations(40, seed=9))
    return [
        f"data.paths=['{train}']",
        "data.format='chat'",
        f"data.tokenizer='{tokenizer}'",
        "model.from_config={ vocab_size = 400 }",
        f"eval.paths=['{held}']",
        "eval.every_steps=4",
        "eval.batches=2",
    ]


@pytest.mark.parametrize("variant", ["documents-zst-heldout", "chat-parquet-evalpaths"])
def test_resume_is_exact_for_every_source_format_and_packing(tmp_path, variant):
    """The data position stays one integer for prepared data of any kind: a resume on 2 ranks
    repeats the losses and eval losses bitwise, a resume on 1 rank (micro-batch 4) within float
    tolerance. The data is prepared once, by rank 0 of the first attempt."""
    run = make_run(JOB, tmp_path, _data_variant(variant, tmp_path))
    first = run_workers(run, 2, job_id="v1")
    root = run.checkpoints_dir()
    ckptfolder.keep_only_up_to(root, 4)
    run_workers(run, 2, job_id="v2")
    ckptfolder.keep_only_up_to(root, 4)
    spec = S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.micro_batch_size=4"])
    run.job_toml.write_text(S.dumps(spec))
    resharded = run_workers(run, 1, job_id="v3")
    losses, evals = rows_by_attempt(run), rows_by_attempt(run, "eval_loss")
    assert sorted(losses[1]) == [5, 6, 7, 8] and sorted(evals[0]) == [4, 8] and sorted(evals[1]) == [8]
    assert all(losses[1][s] == losses[0][s] for s in losses[1]) and evals[1][8] == evals[0][8]  # bitwise
    for step in (5, 6, 7, 8):
        assert losses[2][step] == pytest.approx(losses[0][step], abs=2e-4)
    assert evals[2][8] == pytest.approx(evals[0][8], abs=2e-4)
    assert first[0][1].count("data: preparing train data") == 1 and "data: preparing" not in first[1][1]
    assert "data: preparing" not in resharded[0][1]


def test_kill_9_mid_save_resumes_from_the_previous_complete_checkpoint(tmp_path):
    """A rank is SIGKILLed while step 4's shards are being written; the half-written folder is never used.
    The model is llama-small's width with 2 layers and an 8000-token vocabulary (10M parameters):
    its 130 MB checkpoint keeps the shards being written long enough for the kill to land mid-save
    (llama-tiny's are a few hundred kB), and a step of one 16-token sample per rank stays cheap."""
    run = make_run(
        JOB, tmp_path,
        ["model.preset='llama-small'", "model.from_config={ num_hidden_layers = 2, vocab_size = 8000 }",
         "data.seq_len=16", "train.micro_batch_size=1", "checkpoint.every_steps=2", "train.steps=6"],
    )  # fmt: skip
    root = run.checkpoints_dir()
    procs = launch(["-m", "clusterfsdp.worker", str(run.path)], 2, job_id="k1")
    killed = threading.Event()

    def killer() -> None:
        while not killed.is_set() and procs[1].poll() is None:
            if (root / ".step-00000004.partial").exists():
                procs[1].send_signal(signal.SIGKILL)
                killed.set()
            time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    codes = [code for code, _ in wait(procs, timeout=900)]
    killed.set()
    t.join()
    assert codes[1] == -signal.SIGKILL and codes[0] != 0
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2]
    assert any(e.event == "failed" for e in run.events())
    run_workers(run, 2, job_id="k2")
    assert any(e.event == "resumed" and e.step == 2 and e.job_id == "k2" for e in run.events())
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2, 4, 6]
    assert not list(root.glob(".step-*.partial"))


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_save_and_keep_last(tmp_path, mode):
    """Async saves from a thread, or from a saver process per rank (DCP's process-based async
    save: the staged state reaches it through shared memory), with two writer threads per rank."""
    run = make_run(
        JOB,
        tmp_path,
        ["checkpoint.async=true", "checkpoint.every_steps=2", "checkpoint.keep_last=2",
         f"checkpoint.async_mode='{mode}'", "checkpoint.writer_threads=2"],
    )  # fmt: skip
    out = run_workers(run, 2, job_id="c1")
    root = run.checkpoints_dir()
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [6, 8]
    assert out[0][1].count("(async)") == 3
    assert not list(root.glob(".step-*")) and not list((root / ".pruning").iterdir())
    assert sorted(p.name for p in (root / "step-00000006").glob("*.distcp")) == [
        "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp",
    ]  # fmt: skip
    if mode == "process":  # written by another process: it resumes exactly like a synchronous save
        ckptfolder.keep_only_up_to(root, 6)
        run_workers(run, 2, job_id="c2")
        first, resumed = rows_by_attempt(run)
        assert resumed == {s: first[s] for s in (7, 8)}


def test_staging_buffers_are_made_before_the_first_save_and_pruning_leaves_the_training_thread(tmp_path, monkeypatch):
    """In one process, no torch.distributed: the async stager's host buffers exist before any save
    and are reused by every save; old checkpoints are deleted by the pruner's thread."""
    import torch

    from clusterfsdp.worker import checkpoint as ck

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step() -> None:
        model(torch.randn(4, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    deleted_by: list[str] = []
    rmtree = ck.shutil.rmtree
    monkeypatch.setattr(
        ck.shutil, "rmtree", lambda p, **kw: (deleted_by.append(threading.current_thread().name), rmtree(p, **kw))
    )
    saver = ck.Checkpointer(tmp_path, model, opt, S.CheckpointSection(keep_last=1, async_=True, writer_threads=3))
    stager = saver._stager
    assert stager is not None and stager.ready.wait(60) and stager.state_dict_cache is not None
    buffers = stager.state_dict_cache
    for n in (1, 2, 3):
        step()
        saver.save(n, {"consumed": n, "tokens_seen": 0})
        saver.wait()
    assert stager.state_dict_cache is buffers  # the same buffers for every save
    saved = [p.detach().clone() for p in model.parameters()]
    saver.close()
    assert [c.step for c in ckptfolder.list_checkpoints(tmp_path)] == [3]
    assert deleted_by and all(name.startswith("ckpt-prune") for name in deleted_by), deleted_by
    assert not list((tmp_path / ".pruning").iterdir())
    assert len(list(ckptfolder.step_dir(tmp_path, 3).glob("__0_*.distcp"))) == 3  # one file per writer thread
    step()
    saver.load(ckptfolder.list_checkpoints(tmp_path)[0])
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True))


def _workers_of(controller_pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == controller_pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _submit_local(tmp_path: Path, steps: int) -> runfolder.RunFolder:
    spec = S.loads(
        JOB,
        [f"job.run_root={str(tmp_path)!r}", f"train.steps={steps}", "train.log_every=5", "checkpoint.every_steps=0"],
    )
    return Run.submit(spec, "local").run.folder


def test_sigusr2_saves_requeues_and_resumes_on_the_local_executor(tmp_path):
    """SIGUSR2 once step 20 is logged (100 steps before the end: the signal lands well before it):
    the ranks save, ask for a requeue, and the next attempt resumes and finishes."""
    run = _submit_local(tmp_path, 120)
    job_id = int(run.attempts[-1].job_id)
    _wait_for(lambda: any(r["step"] >= 20 for r in run.metrics()), 300, "step 20")
    for pid in _workers_of(job_id):
        os.kill(pid, signal.SIGUSR2)
    _wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "completion")
    events = [e.event for e in run.events()]
    assert events.index(EventKind.REQUEUED) < events.index(EventKind.RESUMED) < events.index(EventKind.COMPLETED)
    resumed = next(e for e in run.events() if e.event == "resumed")
    assert resumed.restart == 1 and resumed.step is not None and resumed.step >= 20
    assert sorted(p.name for p in run.logs_dir.iterdir()) == [f"{job_id}.0", f"{job_id}.1"]
    assert newest(run).step == 120


def _catches_sigusr2(pid: int) -> bool:
    """Whether the process has a handler installed for SIGUSR2 (SigCgt bit 12 in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1)
    return False


def test_sigusr2_during_start_up_is_kept_and_acted_on_at_the_first_step(tmp_path):
    """A time limit or preemption signal that lands while the ranks still import torch (before
    the model exists) is not lost and does not kill them: they save step 0 and ask for a requeue;
    the next attempt resumes and finishes."""
    run = make_run(JOB, tmp_path)
    # cold: a forked rank (tests/rankserver.py) has torch imported before it starts, and the window
    # between its handlers and its first event is too short to signal into
    procs = launch(["-m", "clusterfsdp.worker", str(run.path)], 2, job_id="early", cold=True)
    _wait_for(lambda: all(_catches_sigusr2(p.pid) for p in procs), 60, "the signal handlers")
    assert not run.events_file.exists()  # still starting up: no rank has trained or logged yet
    for p in procs:
        os.kill(p.pid, signal.SIGUSR2)
    out = wait(procs)
    assert all(code == 0 for code, _ in out), "\n".join(text[-2000:] for _, text in out)
    assert "SIGUSR2: saved step 0" in out[0][1]
    assert [e.event for e in run.events()] == ["start", "requeued"]
    assert newest(run).step == 0
    run_workers(run, 2, job_id="early2")
    assert [e.event for e in run.events()][-2:] == ["resumed", "completed"]
    assert newest(run).step == 8


def test_cancel_saves_then_resume_finishes(tmp_path):
    run = _submit_local(tmp_path, 400)
    _wait_for(lambda: any(r["step"] >= 10 for r in run.metrics()), 300, "step 10")
    r = subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", "cancel", str(run.path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    st = status.run_status(run)
    assert st.state == "CANCELLED" and "saved step" in st.reason
    saved = newest(run).step
    assert saved >= 10
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterfsdp.cli",
            "resume",
            str(run.path),
            "--executor",
            "local",
            "--set",
            "train.steps=" + str(saved + 10),
            "--follow",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumes from step {saved}" in r.stdout
    # the lr curve the resume follows (issue 25.7), said before the attempt is queued
    assert f"note: learning rate: train.steps 400 -> {saved + 10} since the checkpoint" in r.stderr, r.stderr
    assert len(run.attempts) == 2 and status.run_status(run).state == "COMPLETED"
    assert newest(run).step == saved + 10


def test_full_disk_mid_save_fails_clearly_and_resume_uses_the_last_complete_checkpoint(tmp_path):
    """Checkpoints go to a real 2 MiB tmpfs: the step-2 checkpoint (~1.3 MB) fits, step 4 does not.
    Pre-flight is off: it would refuse this disk before step 1 (slurm.preflight_free_gb), and the
    disk that fills up mid-run is what is tested here."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        run = make_run(
            JOB,
            tmp_path,
            [
                f"checkpoint.dir={str(disk)!r}",
                "checkpoint.every_steps=2",
                "checkpoint.keep_last=3",
                "slurm.preflight=false",
            ],
        )
        out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2, job_id="d1"))
        assert all(code != 0 for code, _ in out)
        failed = next(e for e in run.events() if e.event == "failed")
        assert "saving step 4 failed" in failed.reason and "disk full?" in failed.reason, failed
        assert [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_dir())] == [2]
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)  # the user frees space
        run_workers(run, 2, job_id="d2")
        assert any(e.event == "resumed" and e.step == 2 for e in run.events())
        assert [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_dir())] == [4, 6, 8]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_max_restarts_bounds_comebacks_that_make_no_progress(tmp_path):
    """With slurm.max_restarts = 0 an interruption that saved newer progress still comes back
    (a week-long run lives through any number of them); one that did not get past the step it
    resumed from ends the run. The second SIGUSR2 is sent once the new incarnation has written
    its `start` event: its flags are installed and its first stop check (before step 1) is
    still seconds away (the model build and the checkpoint load)."""
    spec = S.loads(
        JOB,
        [
            f"job.run_root={str(tmp_path)!r}",
            "train.steps=400",
            "train.log_every=5",
            "checkpoint.every_steps=0",
            "slurm.max_restarts=0",
        ],
    )
    run = Run.submit(spec, "local").run.folder
    job_id = int(run.attempts[-1].job_id)

    def starts() -> int:
        return sum(1 for e in run.events() if e.event == EventKind.START)

    _wait_for(lambda: any(r["step"] >= 10 for r in run.metrics()), 300, "step 10")
    for pid in _workers_of(job_id):
        os.kill(pid, signal.SIGUSR2)
    _wait_for(lambda: starts() == 2, 300, "the second incarnation's start")  # rank 0 writes it
    for pid in _workers_of(job_id):
        os.kill(pid, signal.SIGUSR2)
    _wait_for(lambda: status.run_status(run).state == "FAILED", 300, "FAILED")
    requeued = next(e for e in run.events() if e.event == EventKind.REQUEUED)
    assert requeued.step is not None and requeued.step >= 10 and requeued.restarts == 0  # progress: free
    reason = status.run_status(run).reason
    assert "no progress since the last restart" in reason and "max_restarts = 0" in reason, reason
    assert newest(run).step == requeued.step  # the state was saved all the same


def _lr_of_attempt(run: runfolder.RunFolder, attempt: int) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in run.metrics() if r["attempt"] == attempt}


def _resume_with(run: runfolder.RunFolder, overrides: list[str], back_to: int, job_id: str) -> tuple[dict, str]:
    """Resume from step `back_to` (newer checkpoints set aside) with `overrides` in the run's
    job.toml, on 1 rank: the resumed attempt's lr per step, and rank 0's output."""
    ckptfolder.keep_only_up_to(run.checkpoints_dir(), back_to)
    run.job_toml.write_text(S.dumps(S.load(run.job_toml, overrides)))
    out = run_workers(run, 1, job_id=job_id)
    attempt = sum(1 for e in run.events() if e.event == EventKind.START) - 1
    return _lr_of_attempt(run, attempt), out[0][1]


def test_changing_steps_on_resume_never_raises_the_lr_unless_asked(tmp_path):
    """Issue 25.7: the lr curve a checkpoint was trained on (lr 3e-3, 2 warmup steps, cosine to
    3e-4 at step 6) is recorded in it; a resume with other train.steps follows
    train.resume_schedule, says so in its first lines, and prints no lr_scheduler warning."""
    run = make_run(
        JOB, tmp_path,
        ["slurm.tasks_per_node=1", "train.micro_batch_size=4", "train.steps=6", "checkpoint.every_steps=3"],
    )  # fmt: skip
    run_workers(run, 1, job_id="s0")
    first = _lr_of_attempt(run, 0)
    peak, end = 3e-3, 3e-4
    assert first[6] == pytest.approx(end) and first[2] == pytest.approx(peak)

    lrs, out = _resume_with(run, ["train.steps=9"], 6, "s1")  # a finished run extended: stays at its end lr
    assert sorted(lrs) == [7, 8, 9] and lrs == pytest.approx(dict.fromkeys(lrs, end)), lrs
    assert (
        "learning rate: train.steps 6 -> 9 since the checkpoint; train.resume_schedule = continue: from step 6 "
        "the lr stays at 3.00e-04 to step 9" in out
    ), out
    assert "get_last_lr" not in out and "lr_scheduler" not in out

    lrs, _ = _resume_with(run, ["train.steps=5"], 3, "s2")  # shortened mid-run: decays to the end, never up
    assert first[3] > lrs[4] > lrs[5] == pytest.approx(end)

    lrs, out = _resume_with(run, ["train.steps=9", "train.resume_schedule='keep'"], 3, "s3")
    assert [lrs[s] for s in (4, 5, 6)] == [first[s] for s in (4, 5, 6)]  # the recorded curve, bit for bit
    assert [lrs[s] for s in (7, 8, 9)] == pytest.approx([end] * 3)

    lrs, _ = _resume_with(run, ["train.steps=9", "train.resume_schedule='rewarm'"], 3, "s4")
    assert first[3] < lrs[4] < lrs[5] == pytest.approx(peak)  # warms up again over train.warmup = 2 steps
    assert [lrs[s] for s in range(5, 10)] == sorted((lrs[s] for s in range(5, 10)), reverse=True)
    assert lrs[9] == pytest.approx(end)

    lrs, _ = _resume_with(run, ["train.steps=9", "train.resume_schedule='stretch'"], 3, "s5")
    planned = {s: end + (peak - end) * 0.5 * (1 + math.cos(math.pi * (s - 2) / 7)) for s in range(4, 10)}
    assert lrs == pytest.approx(planned)  # as if 9 steps had been the plan from the start


class _Planted:
    """What a planted pickle does when loaded: here, create a folder (the test looks for it)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _plant(path: Path, payload: object, meta_file: Path, *, fix_checksum: bool) -> None:
    """Replace a checkpoint file; with `fix_checksum` also its SHA-256 in clusterfsdp.json (an
    attacker who can write the folder can rewrite both)."""
    import hashlib
    import json
    import pickle

    data = pickle.dumps(payload) if not isinstance(payload, bytes) else payload
    path.write_bytes(data)
    if fix_checksum:
        meta = json.loads(meta_file.read_text())
        name = path.relative_to(meta_file.parent).as_posix()
        meta["sha256"][name] = hashlib.sha256(data).hexdigest()
        meta_file.write_text(json.dumps(meta))


def test_planted_pickles_are_refused_and_corrupt_payloads_detected(tmp_path):
    """Issue 29.6: nothing in a checkpoint runs code on resume, and what was not written by the
    save is detected: each bad checkpoint is set aside with a one-line reason (the fallback of
    Checkpointer.load_newest) and the run resumes from the newest good one."""
    run = make_run(
        JOB, tmp_path,
        ["slurm.tasks_per_node=1", "train.micro_batch_size=4", "checkpoint.every_steps=2", "train.steps=8"],
    )  # fmt: skip
    run_workers(run, 1, job_id="p1")
    root = run.checkpoints_dir()
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2, 4, 6, 8]
    marker = tmp_path / "pwned"

    def meta(step: int) -> Path:
        return ckptfolder.step_dir(root, step) / ckptfolder.COMPLETE

    metadata8 = ckptfolder.step_dir(root, 8) / ckptfolder.DCP_METADATA
    _plant(metadata8, _Planted(marker), meta(8), fix_checksum=True)  # DCP's .metadata: a pickle
    rng6 = ckptfolder.rng_file(ckptfolder.step_dir(root, 6), 0)
    _plant(rng6, {"cpu": _Planted(marker)}, meta(6), fix_checksum=True)
    rng4 = ckptfolder.rng_file(ckptfolder.step_dir(root, 4), 0)
    corrupt = bytearray(rng4.read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF  # in the RNG state's bytes: torch.load alone would take it silently
    _plant(rng4, bytes(corrupt), meta(4), fix_checksum=False)
    run.job_toml.write_text(run.job_toml.read_text().replace("steps = 8", "steps = 10"))

    out = run_workers(run, 1, job_id="p2")
    assert not marker.exists()
    fallbacks = {e.step or 0: e.reason for e in run.events() if e.event is EventKind.CHECKPOINT_FALLBACK}
    assert sorted(fallbacks) == [4, 6, 8] and all("\n" not in r for r in fallbacks.values()), fallbacks
    assert "posix.mkdir is not allowed in a DCP .metadata file" in fallbacks[8], fallbacks[8]
    assert "rng/rank0.pt: refused to unpickle it (not plain tensor data)" in fallbacks[6], fallbacks[6]
    assert "rng/rank0.pt: SHA-256 does not match the one recorded" in fallbacks[4], fallbacks[4]
    assert any(e.event == "resumed" and e.step == 2 and e.job_id == "p2" for e in run.events())
    assert [c.step for c in ckptfolder.list_checkpoints(root)][-1] == 10
    assert "checkpoint step 8 did not load, set aside" in out[0][1]
