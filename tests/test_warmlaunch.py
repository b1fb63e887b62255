"""The local executor's controller started by a warm launcher (core/warmlaunch.py, issue 36): in
this suite every pytest process has one (conftest's `_warm_rank_server`, `CLUSTERFSDP_LAUNCHER`),
so a local run's controller is forked by it when its rule allows, and started by `submit` itself
when it does not. Real CLI processes, real launcher processes, real ranks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from procs import tiny_job_toml
from test_run_service import cli, stop, submitted, wait_for

from clusterfsdp.core import warmlaunch
from clusterfsdp.core.records import RunState


def job(tmp_path: Path, steps: int, tail: str = "") -> Path:
    path, root = tmp_path / "job.toml", tmp_path / "runs"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = tiny_job_toml("warm", 0, steps, tail=tail).replace("[job]\n", f'[job]\nrun_root = "{root}"\n', 1)
    path.write_text(f"{text}\n[slurm]\ntasks_per_node = 1\n")
    return path


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_served_controller_leads_its_own_group_trains_and_is_cancelled(tmp_path):
    """Forked by the launcher (its parent), the controller leads a session of its own: the attempt
    records it as the group's leader, the run trains from a controller that imported nothing
    itself, and cancel reaches it and its rank (both gone, the run CANCELLED)."""
    launcher = os.environ[warmlaunch.ENV_LAUNCHER]
    run = submitted(cli("submit", str(job(tmp_path, 100000)), "--executor", "local"))
    try:
        attempt = run.folder.record().last
        assert attempt is not None and attempt.leader is not None
        controller = int(attempt.job_id)
        assert attempt.leader.pid == controller and os.getsid(controller) == controller == os.getpgid(controller)
        assert launcher.encode() in Path(f"/proc/{parent_of(controller)}/cmdline").read_bytes()  # the launcher's child
        wait_for(lambda: run.folder.metrics(), 120, "a logged step")
        said = (run.folder.submitit_dir / "local-controller.log").read_text()
        assert f"clusterfsdp local controller {controller}: warm start: imports done in 0." in said, said
        assert "controller started here" not in said
    finally:
        stop(run)
    wait_for(lambda: run.status().state is RunState.CANCELLED, 120, "the cancel")
    assert not Path(f"/proc/{controller}").exists() or "Z" in Path(f"/proc/{controller}/stat").read_text().split()[2]


def test_a_controller_the_launcher_may_not_fork_starts_here_and_says_why(tmp_path):
    """A job whose [env] changes what the imports see is refused by the launcher's rule: `submit`
    starts the controller itself (its child's session, as without a launcher) and the reason is in
    the controller's log; a launcher socket that is not there is said the same way."""
    run = submitted(cli("submit", str(job(tmp_path, 2, tail='[env]\nPLAIN_SETTING = "1"\n')), "--executor", "local"))
    wait_for(lambda: run.status().state is RunState.COMPLETED, 180, "the run")
    said = (run.folder.submitit_dir / "local-controller.log").read_text()
    assert "controller started here: an import-time environment other than the server's: PLAIN_SETTING" in said
    attempt = run.folder.record().last
    assert attempt is not None and attempt.leader is not None and attempt.leader.pid != int(attempt.job_id)

    missing = tmp_path / "no-launcher"
    r = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "submit", str(job(tmp_path / "b", 2)), "--executor", "local"],
        capture_output=True, text=True, timeout=120, env={**os.environ, warmlaunch.ENV_LAUNCHER: str(missing)},
    )  # fmt: skip
    second = submitted(r)
    wait_for(lambda: second.status().state is RunState.COMPLETED, 180, "the second run")
    said = (second.folder.submitit_dir / "local-controller.log").read_text()
    assert f"controller started here: the launcher at {missing} did not answer: [Errno 2]" in said, said


def test_the_client_asks_nobody_without_a_launcher_and_refuses_another_users():
    """Without CLUSTERFSDP_LAUNCHER nothing is asked; a socket whose listener is another user's is
    not trusted with the command and its environment (SO_PEERCRED)."""
    assert warmlaunch.start(["true"], {}) == (None, f"{warmlaunch.ENV_LAUNCHER} is not set")
    folder = Path(tempfile.mkdtemp())  # (under /tmp: the other user reaches it, not pytest's 0700 folders)
    os.chmod(folder, 0o777)
    path = folder / "theirs.sock"
    listener = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "import socket, sys, time; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1]); "
         "s.listen(1); print('up', flush=True); c, _ = s.accept(); time.sleep(30)", str(path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "up\n"
        pid, why = warmlaunch.start(["true"], {warmlaunch.ENV_LAUNCHER: str(path)})
        assert pid is None and why == f"the launcher at {path} runs as uid 65534, not this user's"
    finally:
        listener.kill()
        listener.wait()
        shutil.rmtree(folder)


def test_an_export_is_run_by_the_launcher_and_its_exit_status_comes_back(tmp_path):
    """`clusterfsdp export`'s export (Run.export) is forked by the launcher when its rule allows:
    `warmlaunch.run` gives its exit status back (0, then 2 for a refusal of its own) and the folder
    is the export's. Asked from inside a Slurm job, or with an environment the launcher's imports
    did not see, it is not served (None: the caller starts it itself)."""
    from procs import make_run, run_workers

    run = make_run(tiny_job_toml("export", 0, 2), tmp_path / "runs")
    run_workers(run, 1)
    out = tmp_path / "hf"
    argv = [sys.executable, "-m", "clusterfsdp.worker.export", str(run.path), "--to", str(out)]
    assert warmlaunch.run(argv, os.environ) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert warmlaunch.run(argv, os.environ) == 2  # not empty without --force: the export's own refusal
    assert warmlaunch.run([*argv, "--force"], {**os.environ, "SLURM_JOB_ID": "7"}) is None
    assert warmlaunch.run([*argv, "--force"], {**os.environ, "PLAIN_SETTING": "1"}) is None


def test_signals_to_the_waiting_process_go_on_to_the_served_one():
    """While `warmlaunch.run` waits, SIGINT, SIGTERM and SIGHUP sent to it go to the process it
    waits for (no process group joins them any more), and its own handlers are back afterwards."""
    child = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(child.pid)
    try:
        before = signal.getsignal(signal.SIGTERM)
        with warmlaunch._passed_on(lambda sig: signal.pidfd_send_signal(pidfd, sig)):
            os.kill(os.getpid(), signal.SIGTERM)
            assert child.wait(timeout=30) == -signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == before
    finally:
        os.close(pidfd)
        child.kill()
        child.wait()


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_controller_ahead_of_its_submitter_makes_its_job_folder(tmp_path: Path, monkeypatch, warm: bool) -> None:
    """The job folder is named by the controller's pid, and the submitting process makes it once
    it has the pid; a served controller has nothing to import and can open its tasks' log files
    first. Run 41 (issue 36) saw `FileNotFoundError: .../submitit/16431/16431_0_log.out` and a
    crossproduct draw that never started. Both controllers make the folder when it is missing."""
    from clusterfsdp.core import localctl
    from clusterfsdp.worker import warmctl

    monkeypatch.setenv("SUBMITIT_LOCAL_NTASKS", "2")
    monkeypatch.setenv("SUBMITIT_LOCAL_COMMAND", f"{sys.executable} -c pass")
    monkeypatch.setenv("SUBMITIT_LOCAL_TIMEOUT_S", "60")
    monkeypatch.setenv("SUBMITIT_LOCAL_SIGNAL_DELAY_S", "10")
    monkeypatch.setenv("SUBMITIT_STDERR_TO_STDOUT", "")
    monkeypatch.setenv("SUBMITIT_LOCAL_WITH_SHELL", "")
    before = signal.getsignal(signal.SIGTERM)
    folder = tmp_path / "submitit" / "%j"
    try:  # (no run folder: the warm one's preload fails and it starts its tasks as Popen)
        controller = warmctl.Controller(folder, str(tmp_path / "no-run")) if warm else localctl.Controller(folder)
        job = tmp_path / "submitit" / str(os.getpid())
        assert not job.exists()
        controller.start_tasks()
        assert [t.wait(timeout=60) for t in controller.tasks] == [0, 0]
        logs = [f"{os.getpid()}_{k}_log.{kind}" for k in range(2) for kind in ("err", "out")]
        assert sorted(p.name for p in job.iterdir()) == logs
        controller.kill_tasks()
    finally:
        signal.signal(signal.SIGTERM, before)
