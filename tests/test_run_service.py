"""The run service keeps a run folder consistent under ordinary use: a live run gets no second
attempt, of two concurrent resumes exactly one starts, a refused resume changes nothing, a
recycled pid is never trusted, a newest checkpoint that does not load falls back to the previous
one, secrets never reach a file, `submit` returns at once into a pipe, and one rule finds runs
from any folder. Real CLI processes, real workers on the local executor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import CORPUS, launch, make_run, run_workers, tiny_job_toml, wait

from clusterfsdp.control import status
from clusterfsdp.control.run import Run
from clusterfsdp.core import ckptfolder, procs, runfolder
from clusterfsdp.core.records import EventKind, Executor, RunState

SECRETS = {
    "SSH_KEY": "s3cr3t-ssh-9f1c",
    "MY_SERVICE_KEY": "s3cr3t-svc-77ab",
    "WANDB_KEY": "s3cr3t-wandb-0e2d",
    "DB_PASS": "s3cr3t-db-51aa",
    "HF_TOKEN": "s3cr3t-hf-c0de",
    "GIT_AUTH": "s3cr3t-auth-42",
    "PRIVATE_THING": "s3cr3t-priv-13",
    "AWS_CREDENTIALS": "s3cr3t-aws-88",
}


def cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def long_job(tmp_path: Path, steps: int = 100000, tail: str = "") -> Path:
    """One local worker training for a long time, checkpointing every 5 steps (none pruned while it
    runs, so the tests can compare the checkpoint list before and after a refused command)."""
    job = tmp_path / "job.toml"
    text = tiny_job_toml("svc", 0, steps, tail=f"[checkpoint]\nevery_steps = 5\nkeep_last = 1000\n{tail}")
    job.write_text(
        f"{text}\n[slurm]\ntasks_per_node = 1\n".replace("[job]\n", f'[job]\nrun_root = "{tmp_path / "runs"}"\n', 1)
    )
    return job


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def submitted(r: subprocess.CompletedProcess) -> Run:
    assert r.returncode == 0, r.stderr
    m = re.search(r"folder (\S+)", r.stdout)
    assert m, r.stdout
    return Run(m.group(1))


def stop(run: Run) -> None:
    last = run.folder.record().last
    if last is not None and last.leader is not None and procs.group_alive(last.leader):
        run.cancel(grace_s=30)


def test_a_live_run_gets_no_second_attempt_and_refused_resumes_change_nothing(tmp_path):
    run = submitted(cli("submit", str(long_job(tmp_path)), "--executor", "local"))
    try:
        wait_for(lambda: ckptfolder.find(run.folder.checkpoints_dir()) is not None, 240, "a first checkpoint")
        job_before, state_before = run.folder.job_toml.read_text(), run.folder.state_file.read_text()

        def complete() -> set[str]:  # (saves in progress and `.pruning/` come and go meanwhile)
            return {c.path.name for c in ckptfolder.list_checkpoints(run.folder.checkpoints_dir())}

        ckpts_before = complete()

        r = cli("resume", str(run.path))
        assert r.returncode == 2 and "has a live attempt: local job" in r.stderr, r.stderr
        r = cli("resume", str(run.path), "--step", "5", "--set", "slurm.nodes=4")
        assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert run.folder.job_toml.read_text() == job_before and run.folder.state_file.read_text() == state_before
        assert not (run.folder.checkpoints_dir() / "set-aside").exists()
        assert ckpts_before <= complete()  # none removed (keep_last is large: training goes on)

        first = run.folder.record().last
        assert first is not None and first.leader is not None
        r = cli("resume", str(run.path), "--force", timeout=300)
        assert r.returncode == 0, r.stderr
        assert not procs.group_alive(first.leader)  # the old attempt is gone: it was cancelled and waited for
        record = run.folder.record()
        assert record.attempts[0].job_id == first.job_id and len(record.attempts) == 2
        stopped = [e for e in run.folder.events(first.job_id) if e.event is EventKind.STOPPED]
        assert stopped and record.attempts[1].resume_step == stopped[0].step  # resumed from the save it made
        wait_for(lambda: run.status().state is RunState.RUNNING, 120, "the new attempt")
    finally:
        stop(run)


RESUME_RACE = """
import sys, time
from clusterfsdp.cli import main
start = float(sys.argv[2])
while time.time() < start:
    pass
sys.exit(main(["resume", sys.argv[1]]))
"""


def test_of_two_concurrent_resumes_exactly_one_starts(tmp_path):
    run = submitted(cli("submit", str(long_job(tmp_path)), "--executor", "local"))
    wait_for(lambda: run.status().state is RunState.RUNNING, 240, "the first attempt")
    stop(run)
    start = str(time.time() + 2.0)
    racers = [
        subprocess.Popen([sys.executable, "-c", RESUME_RACE, str(run.path), start], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in racers]
        codes = sorted(code for code, _ in results)
        assert codes == [0, 2], results
        loser = next(err for code, err in results if code == 2)
        assert "being changed by" in loser or "has a live attempt" in loser, loser
        assert len(run.folder.record().attempts) == 2
    finally:
        stop(run)


def test_a_recycled_pid_is_never_trusted(tmp_path):
    """The recorded leader's pid now belongs to another process (this test's): status must not
    say RUNNING and cancel must not signal it."""
    spec_run = make_run(tiny_job_toml("reuse", 0, 4), tmp_path)
    mine = procs.ProcessId.of(os.getpid())
    impostor = procs.ProcessId(mine.pid, mine.start + 12345, mine.host, mine.boot)
    spec_run.add_attempt("900", Executor.LOCAL, "submit", leader=impostor)
    st = status.run_status(spec_run)
    assert st.state is not RunState.RUNNING and st.state is not RunState.PENDING
    assert Run(spec_run).cancel(grace_s=1) == f"run {spec_run.id}: nothing running"  # and we are still here


def test_a_newest_checkpoint_that_does_not_load_falls_back_to_the_previous_one(tmp_path):
    run = make_run(tiny_job_toml("corrupt", 0, 6), tmp_path, ["checkpoint.every_steps=2", "checkpoint.keep_last=3"])
    run_workers(run, 2, job_id="c1")
    root = run.checkpoints_dir()
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2, 4, 6]
    (ckptfolder.step_dir(root, 6) / ".metadata").write_bytes(b"garbage, not a pickle")
    shard = sorted(ckptfolder.step_dir(root, 4).glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])  # truncated
    text = run.job_toml.read_text().replace("steps = 6", "steps = 8")
    run.job_toml.write_text(text)
    out = run_workers(run, 2, job_id="c2")
    events = run.events()
    fallbacks = [e for e in events if e.event is EventKind.CHECKPOINT_FALLBACK]
    assert [e.step for e in fallbacks] == [6, 4], fallbacks
    assert all(e.reason.startswith("did not load, set aside: ") for e in fallbacks)
    resumed = next(e for e in events if e.event is EventKind.RESUMED and e.job_id == "c2")
    assert resumed.step == 2
    aside = sorted(p.name for p in (root / "set-aside").iterdir())
    assert [n.split("-unreadable-")[0] for n in aside] == ["step-00000004", "step-00000006"]
    assert "checkpoint step 6 did not load, set aside" in out[0][1]
    notes = status.run_status(run).notes  # what `status` prints under the attempts
    assert [n.split(":")[0] for n in notes] == ["step 6", "step 4"]
    assert [c.step for c in ckptfolder.list_checkpoints(root)][-1] == 8


def test_secrets_never_land_in_files_or_output_and_resume_needs_them(tmp_path):
    env_lines = "\n".join(f'{k} = "{v}"' for k, v in SECRETS.items())
    job = long_job(tmp_path, tail=f'[env]\n{env_lines}\nPLAIN_SETTING = "visible"\n')
    r = cli("submit", str(job), "--executor", "local")
    run = submitted(r)
    try:
        wait_for(lambda: ckptfolder.find(run.folder.checkpoints_dir()) is not None, 240, "a checkpoint")
        worker = _worker_pid(run)
        environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
        for key, value in SECRETS.items():  # the workers have them, from the environment
            assert f"{key}={value}".encode() in environ, key
        dry = cli("submit", str(job), "--dry-run")
        outputs = [r.stdout + r.stderr, dry.stdout + dry.stderr, cli("status", str(run.path)).stdout]
        stop(run)
    finally:
        stop(run)
    assert "PLAIN_SETTING" in run.folder.job_toml.read_text()  # the test would see a value in the file
    places = [p for p in tmp_path.rglob("*") if p.is_file() and p != job]
    assert any(p.suffix == ".distcp" for p in places) and any(p.name == "sbatch.sh" for p in places)
    for value in SECRETS.values():
        assert not [p for p in places if value.encode() in p.read_bytes()], value
        assert not [o for o in outputs if value in o], value

    clean = {k: "" for k in SECRETS}  # a shell without the secrets (empty is "set": drop them instead)
    env = {k: v for k, v in os.environ.items() if k not in clean}
    r = subprocess.run([sys.executable, "-m", "clusterfsdp", "resume", str(run.path)], capture_output=True,
                       text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 2 and all(k in r.stderr for k in SECRETS) and "--without-secrets" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "clusterfsdp", "resume", str(run.path), "--without-secrets"],
                       capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    stop(run)


def _worker_pid(run: Run) -> int:
    last = run.folder.record().last
    assert last is not None and last.leader is not None
    workers = [p for p in procs.group_members(last.leader.pid) if b"submitit.core._submit" in _cmdline(p)]
    assert workers, procs.group_members(last.leader.pid)
    return workers[0]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_submit_returns_at_once_into_a_pipe(tmp_path):
    job = long_job(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run(
        f'RUN=$({sys.executable} -m clusterfsdp submit {job} --executor local); echo "got: $RUN"',
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    run = submitted(subprocess.CompletedProcess([], 0, r.stdout.replace("got: ", ""), r.stderr))
    try:
        assert r.stdout.startswith("got: run ") and took < 60
        assert run.status().state in (RunState.PENDING, RunState.RUNNING)  # it went on in the background
    finally:
        stop(run)


def test_one_rule_finds_runs_from_any_folder(tmp_path):
    """A job file without run_root goes to $CLUSTERFSDP_RUN_ROOT; `status`, `runs` and `logs`
    find it from another folder; the user config file works the same way; a job file's own
    run_root wins."""
    jobs, elsewhere, shared = tmp_path / "jobs", tmp_path / "elsewhere", tmp_path / "shared-runs"
    jobs.mkdir()
    elsewhere.mkdir()
    (jobs / "job.toml").write_text(f'[job]\nname = "rooted"\n[data]\nsource = "files"\npaths = ["{CORPUS}"]\n')
    env = {"CLUSTERFSDP_RUN_ROOT": str(shared)}
    r = cli("submit", "job.toml", "--dry-run", cwd=jobs, env=env)
    assert r.returncode == 0, r.stderr
    (run_dir,) = list((shared / "rooted").iterdir())
    assert cli("status", run_dir.name, cwd=elsewhere, env=env).returncode == 0
    assert run_dir.name in cli("runs", cwd=elsewhere, env=env).stdout
    assert cli("status", run_dir.name, cwd=elsewhere).returncode == 2  # without the setting: ./runs there

    config = tmp_path / "xdg"
    (config / "clusterfsdp").mkdir(parents=True)
    (config / "clusterfsdp" / "config.toml").write_text(f'run_root = "{shared}"\n')
    assert run_dir.name in cli("runs", cwd=elsewhere, env={"XDG_CONFIG_HOME": str(config)}).stdout

    own = tmp_path / "own"
    (jobs / "own.toml").write_text(f'[job]\nname = "own"\nrun_root = "{own}"\n')
    assert cli("submit", "own.toml", "--dry-run", cwd=jobs, env=env).returncode == 0
    assert (own / "own").is_dir() and not (shared / "own").exists()


def test_a_second_attempt_started_by_hand_beside_a_live_one_stops_before_training(tmp_path):
    """The worker-side guard: rank 0 holds the run's attempt lock while training, so a second set
    of workers in the same folder (a dry-run script submitted twice, a resume that raced past the
    control plane) exits with a clear error and writes no checkpoint or metrics."""
    run = make_run(tiny_job_toml("guard", 0, 100000), tmp_path, ["checkpoint.every_steps=5"])
    first = launch(["-m", "clusterfsdp.worker", str(run.path)], 1, job_id="g1")
    try:
        wait_for(lambda: any(e.event is EventKind.START for e in run.events()), 240, "the first attempt")
        metrics_before = run.metrics_file.stat().st_size if run.metrics_file.exists() else 0
        ((code, out),) = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 1, job_id="g2"), timeout=300)
        assert code != 0 and "another attempt is training in this run folder" in out, out[-2000:]
        failed = [e for e in run.events("g2") if e.event is EventKind.FAILED]
        assert failed and "job g1" in failed[0].reason
        assert not [e for e in run.events("g2") if e.event is EventKind.START]
        # the refused second set did not disturb the first: it is still running and keeps training
        # (its metrics grow past what they were before the second set started)
        assert first[0].poll() is None

        def size() -> int:
            return run.metrics_file.stat().st_size if run.metrics_file.exists() else 0

        wait_for(lambda: size() > metrics_before, 240, "the first attempt to log another step")
        assert first[0].poll() is None
    finally:
        for p in first:
            p.kill()
            p.wait()


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path):
    yield
    for folder in runfolder.list_runs(tmp_path / "runs"):
        for attempt in folder.attempts:
            if attempt.leader is not None:
                procs.signal_group(attempt.leader, __import__("signal").SIGKILL)


def test_old_state_files_still_read(tmp_path):
    """A state.json written before the typed records (a bare pgid, no leader) reads, and its
    unverifiable process group is not trusted."""
    run = make_run(tiny_job_toml("old", 0, 4), tmp_path)
    record = json.loads(run.state_file.read_text())
    record["attempts"] = [{"attempt": 0, "job_id": "77", "executor": "local", "submitted": 1.0, "pgid": os.getpid()}]
    run.state_file.write_text(json.dumps(record))
    (attempt,) = run.attempts
    assert attempt.job_id == "77" and attempt.leader is None
    assert status.run_status(run).state is RunState.FAILED


def test_a_resume_whose_queueing_fails_puts_everything_back(tmp_path):
    """Checkpoints set aside for `resume --step` and the rewritten job.toml are restored when
    the attempt cannot be queued (here: submitit/ is a file, so submitit cannot write there)."""
    run = make_run(tiny_job_toml("undo", 0, 8), tmp_path)
    root = run.checkpoints_dir()
    for step in (2, 4, 6):  # complete checkpoints as the folder layout defines them
        folder = ckptfolder.step_dir(root, step)
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"x")
        (folder / ckptfolder.COMPLETE).write_text(json.dumps({"step": step}))
    job_before = run.job_toml.read_text()
    run.submitit_dir.rmdir()
    run.submitit_dir.write_text("not a folder")
    r = cli("resume", str(run.path), "--step", "2", "--set", "train.steps=9", "--executor", "local")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert [c.step for c in ckptfolder.list_checkpoints(root)] == [2, 4, 6]
    assert not list((root / "set-aside").iterdir()) if (root / "set-aside").exists() else True
    assert run.job_toml.read_text() == job_before and run.attempts == []


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_a_run_root_that_cannot_be_created_is_one_line_before_anything_is_made(tmp_path, dry_run):
    """Issue 25.2: one run-root check for submit and the dry run. /proc passes every permission
    check for root (os.access says writable) and still refuses a new folder: the check creates
    the run root, so both commands exit 2 with one line naming job.run_root, no traceback."""
    job = long_job(tmp_path, steps=4)
    flag = ["--dry-run"] if dry_run else ["--executor", "local"]
    r = cli("submit", str(job), *flag, "--set", "job.run_root=/proc/clusterfsdp-x/runs")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: job.run_root: cannot create /proc/clusterfsdp-x"
    ), r.stderr
    assert not (tmp_path / "runs").exists()
