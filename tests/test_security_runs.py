"""A shared run root is hostile (issue 29, items 2 and 3): another user's planted run folder must
not make your `cancel`, `resume` or `export` act for them (kill your processes, scancel a job,
run its setup lines as you), and a corrupt or planted pid in state.json must neither look live
forever nor make `cancel` signal its own process group. A real second local user (tests/users.py)
plants the folders; the commands run as the test's user (root) through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import make_run
from users import OtherUser

from clusterfsdp.core import ownership, procs, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor

RUN_ID = "20260101-120000-aaaa"


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp", *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def _with_attempt(run: runfolder.RunFolder, **changes) -> None:
    """Edit the first attempt of the run's state.json as a hand (or an attacker) would."""
    data = json.loads(run.state_file.read_text())
    data["attempts"][0].update(changes)
    run.state_file.write_text(json.dumps(data))


def _planted(tmp_path: Path, other: OtherUser, root: Path, **attempt) -> Path:
    """A live-looking run made by the other user in the shared root; its attempt says `attempt`."""
    staging = tmp_path / "staging"
    run = make_run(staging, RUN_ID, executor=attempt.pop("executor", "local"), end=None)
    _with_attempt(run, **attempt)
    other.plant_copy(staging / "tiny-cpu", root)
    planted = root / "tiny-cpu" / RUN_ID
    assert planted.stat().st_uid == other.uid
    return planted


def test_cancel_of_a_planted_run_naming_your_process_is_refused(tmp_path, other_user, shared_root):
    """Reproduced: root's `cancel` of another user's run killed root's unrelated process."""
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        planted = _planted(tmp_path, other_user, shared_root, leader=procs.ProcessId.of(victim.pid).record())
        before = (planted / "state.json").read_bytes()
        r = cli("cancel", str(planted))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "refusing to cancel" in r.stderr and str(planted) in r.stderr and other_user.name in r.stderr
        assert victim.poll() is None  # still running
        assert (planted / "state.json").read_bytes() == before and not (planted / ".lock").exists()
    finally:
        victim.kill()
        victim.wait()


def test_scancel_resume_and_export_of_a_planted_run_are_refused(tmp_path, other_user, shared_root):
    """A planted Slurm attempt would make `cancel` scancel any job id; a resume would run the
    planted job.toml's slurm.setup as you; an export would unpickle its checkpoint."""
    planted = _planted(tmp_path, other_user, shared_root, executor="slurm", job_id="4242")
    before = {p: p.read_bytes() for p in planted.rglob("*") if p.is_file()}
    for argv in (["cancel"], ["resume", "--executor", "local"], ["export", "--to", str(tmp_path / "hf")]):
        r = cli(argv[0], str(planted), *argv[1:])
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert f"refusing to {argv[0]} run {planted}" in r.stderr and other_user.name in r.stderr, r.stderr
        assert "scancel" not in r.stderr
    assert {p: p.read_bytes() for p in planted.rglob("*") if p.is_file()} == before  # nothing touched
    assert not (tmp_path / "hf").exists()
    # read-only commands still show it
    listed = cli("runs", "--run-root", str(shared_root))
    assert listed.returncode == 0 and RUN_ID in listed.stdout, listed.stderr
    shown = cli("status", str(planted))
    assert shown.returncode == 0 and RUN_ID in shown.stdout, shown.stderr


def test_a_trusted_group_makes_its_members_runs_yours_to_act_on(tmp_path, other_user, shared_root):
    planted = _planted(tmp_path, other_user, shared_root)  # a local attempt with no live leader
    env = {**os.environ, ownership.ENV_TRUSTED_GROUP: other_user.name}  # its own group, named
    r = cli("cancel", str(planted), env=env)
    assert r.returncode == 0 and "nothing running" in r.stdout, r.stdout + r.stderr


def test_a_run_folder_every_user_may_write_is_refused(tmp_path):
    run = make_run(tmp_path / "runs", RUN_ID, end=None)
    run.path.chmod(0o777)
    r = cli("cancel", str(run.path))
    assert r.returncode == 2 and f"{run.path} is writable by every user" in r.stderr, r.stderr


def test_submit_into_another_users_job_folder_is_refused(tmp_path, tiny_job, other_user, shared_root):
    other_user.plant(shared_root, {"tiny-cpu/README": b"mine\n"})  # the job name's folder is theirs
    job = tmp_path / "job.toml"
    job.write_text(tiny_job.read_text().replace(str(tmp_path / "runs"), str(shared_root)))
    assert S.load(job).job.name == "tiny-cpu"
    r = cli("submit", str(job), "--executor", "local")
    assert r.returncode == 2 and f"refusing to submit into {shared_root / 'tiny-cpu'}" in r.stderr, r.stderr
    assert [p.name for p in (shared_root / "tiny-cpu").iterdir()] == ["README"]


# ---- pids read from files (item 3)

SIGNAL_OWN = """
import os, signal, socket
from clusterfsdp.core import procs
here = procs.ProcessId.of(os.getpid())
for pid in (0, -1, os.getpgrp()):
    leader = procs.ProcessId(pid, procs.start_ticks(pid) or 0 if pid > 0 else 0, here.host, here.boot)
    print(pid == os.getpgrp() or pid, procs.signal_group(leader, signal.SIGKILL), flush=True)
print("alive", flush=True)
"""


def test_a_recorded_pid_of_0_or_of_our_own_group_is_never_signalled(tmp_path):
    """killpg(0) signals the caller's own group, killpg(-1)... everything: run in a session of its
    own, so that without the check only that subprocess dies (its 'alive' line missing)."""
    r = subprocess.run([sys.executable, "-c", SIGNAL_OWN], capture_output=True, text=True, timeout=60,
                       start_new_session=True)  # fmt: skip
    assert r.returncode == 0 and r.stdout.split("\n") == ["0 False", "-1 False", "True False", "alive", ""], r


def test_pid_problem_table():
    for pid in (0, 1, -1, procs.pid_max() + 1, 2**70):
        assert procs.pid_problem(pid) is not None, pid
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert procs.pid_problem(child.pid) is None
        assert procs.group_alive(procs.ProcessId.of(child.pid))
    finally:
        child.kill()
        child.wait()


def test_status_says_a_leader_pid_of_0_is_invalid_and_cancel_does_not_signal(tmp_path):
    """Reproduced: pid 0 (kernel threads are in process group 0) read as a live group: PENDING
    forever, and `cancel` called killpg(0)."""
    run = make_run(tmp_path / "runs", RUN_ID, end=None)
    here = procs.ProcessId.of(os.getpid())
    _with_attempt(run, leader={"pid": 0, "start": 0, "host": here.host, "boot": here.boot})
    r = cli("status", str(run.path), "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["state"] == "UNKNOWN" and "invalid leader record" in shown["reason"], shown
    cancelled = subprocess.run([sys.executable, "-m", "clusterfsdp", "cancel", str(run.path)], capture_output=True,
                               text=True, timeout=120, start_new_session=True)  # fmt: skip
    assert cancelled.returncode == 0 and "nothing running" in cancelled.stdout, cancelled


def test_a_notebook_run_is_not_made_in_another_users_job_folder(other_user, shared_root):
    """The notebook makes its runs with runfolder.create_run directly: the same rule holds there."""
    other_user.plant(shared_root, {"nb/README": b"mine\n"})
    spec = S.loads(f'[job]\nname = "nb"\nrun_root = "{shared_root}"\n')
    with pytest.raises(PermissionError, match=f"refusing to submit into {shared_root / 'nb'}: .* owned by cfsdp-other"):
        runfolder.create_run(spec, Executor.SRUN)
    assert [p.name for p in (shared_root / "nb").iterdir()] == ["README"]


def test_cancel_says_so_when_it_could_signal_nothing(tmp_path):
    """Reproduced: `cancel` of a live local attempt whose process group it may not signal (here
    the group `cancel` itself runs in, as a notebook kernel's own launch would be) waited out its
    grace period and printed 'local job 1001: stopped' having sent nothing, and recorded the
    attempt as cancelled. It says that no signal could be sent and records nothing; the group
    runs on."""
    run = make_run(tmp_path / "runs", RUN_ID, end=None)
    group = subprocess.Popen(["sleep", "120"], process_group=0)
    try:
        _with_attempt(run, leader=procs.ProcessId.of(group.pid).record())
        cancelled = subprocess.run([sys.executable, "-m", "clusterfsdp", "cancel", str(run.path)], capture_output=True,
                                   text=True, timeout=120, preexec_fn=lambda: os.setpgid(0, group.pid))  # fmt: skip
        assert cancelled.returncode == 0, cancelled
        assert cancelled.stdout == f"run {RUN_ID}: local job 1001 runs, but no signal could be sent to it\n"
        last = run.record().last
        assert group.poll() is None and last is not None and last.cancelled is None
    finally:
        group.kill()
        group.wait()


def test_another_users_log_is_shown_escaped_and_your_own_as_it_is(tmp_path, other_user, shared_root):
    """`logs` prints a log's own bytes as `cat` does (progress bars, colours), which let a log
    planted by another user in a shared run root set the reader's window title or write the
    clipboard (OSC 52). Another user's log is now escaped like every other line; yours is not."""
    from procs import on_a_tty

    evil = "step 1 \x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07 \x1b[32mgreen\x1b[0m"
    staging = tmp_path / "staging"
    mine = make_run(staging, RUN_ID, end="completed", log_lines=1)
    log = next(mine.logs_dir.glob("*/rank0.log"))
    log.write_text(evil + "\n")
    planted = other_user.plant_copy(staging / "tiny-cpu", shared_root) / RUN_ID
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    theirs = on_a_tty("logs", str(planted), env=env)
    assert "\x1b]0;pwned" not in theirs and "\x07" not in theirs, theirs
    assert "step 1 \\x1b]0;pwned\\x07\\x1b]52;c;cHduZWQ=\\x07 \\x1b[32mgreen\\x1b[0m" in theirs, theirs
    assert evil in on_a_tty("logs", str(mine.path), env=env)  # your own log: as it is
