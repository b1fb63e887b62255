"""Slurm attempts through submitit's SlurmExecutor: its batch script (golden text), its pickled
call and folder layout, sbatch through slurmcli's retries, and job.toml values that can never
run as shell code."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from clusterfsdp.control import launch
from clusterfsdp.control.run import Run
from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor

GOLDEN = Path(__file__).parent / "golden" / "sbatch_2node.sh"
JOB = """
[job]
name = "llm"
run_root = "RUNROOT"
[slurm]
partition = "gpu"
account = "proj"
nodes = 2
gpus_per_node = 4
cpus_per_task = 8
mem_gb = 64
time = "0-02:00:00"
constraint = "h100&ib"
signal_grace_s = 180
extra = { reservation = "big", "gres-flags" = "enforce-binding" }
setup = ["module load cuda/12.4"]
"""


def render(tmp_path: Path, job: str) -> tuple[str, runfolder.RunFolder]:
    spec = S.loads(job.replace("RUNROOT", str(tmp_path / "runs")))
    run = runfolder.create_run(spec, Executor.SLURM, run_id="RUNID")
    return launch.render_sbatch(spec, run), run


def normalize(script: str, tmp_path: Path) -> str:
    return script.replace(str(tmp_path), "<TMP>").replace(sys.executable, "<PYTHON>")


def test_golden_two_node_script(tmp_path):
    script, _ = render(tmp_path, JOB)
    text = normalize(script, tmp_path)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@180",
        "#SBATCH --time=120",
        "#SBATCH --mem=65536M",
        "#SBATCH --reservation=big",
        "#SBATCH --no-kill",
    ]:
        assert line in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in srun
    assert srun.endswith("<PYTHON> -u -m submitit.core._submit <TMP>/runs/llm/RUNID/submitit")
    assert "--hold" not in text and "--comment" not in text  # a dry run: nobody would release it


def test_requeue_false_renders_no_requeue(tmp_path):
    script, _ = render(tmp_path, JOB + "requeue = false\n")
    assert "#SBATCH --no-requeue" in script and "#SBATCH --requeue" not in script


# The injection found in the issue: Slurm's #SBATCH parser honours backslashes inside quotes, so
# this partition (TOML: "gpu\\'x\" --chdir=/tmp/X --comment=X #") smuggled --chdir and --comment in.
INJECTIONS = [
    ("partition", "gpu\\'x\" --chdir=/tmp/X --comment=X #"),
    ("partition", "gpu\ntouch PWNED"),
    ("account", "a b"),
    ("account", "a\rb"),
    ("qos", "normal;touch PWNED"),
    ("constraint", "x\x00"),
    ("constraint", "h100 --chdir=/"),
    ("extra.comment", '"x" --chdir=/tmp'),
    ("extra.comment", "$(touch PWNED)"),
    ("extra.mail-user", "me@x.org`id`"),
]


@pytest.mark.parametrize("key,value", INJECTIONS)
def test_values_outside_the_sbatch_allowlist_are_refused_with_the_key_named(key, value):
    literal = tomli_w.dumps({"v": value}).strip().removeprefix("v = ")
    name = key.removeprefix("extra.")
    text = f"[slurm]\nextra = {{ {name} = {literal} }}\n" if key != name else f"[slurm]\n{name} = {literal}\n"
    with pytest.raises(S.SpecError) as e:
        S.loads(text)
    refused = ("may only contain", "contains a NUL character")  # NUL: refused for every string, before the allowlist
    assert any(err.startswith(f"slurm.{key}: ") and any(r in err for r in refused) for err in e.value.errors), e.value


def test_an_extra_option_name_outside_the_allowlist_is_refused():
    with pytest.raises(S.SpecError, match=r"slurm\.extra\.Chdir X: not an sbatch option name"):
        S.loads('[slurm]\nextra = { "Chdir X" = "y" }\n')


def test_run_root_with_shell_characters_is_refused(tmp_path):
    spec = S.loads(f'[job]\nrun_root = "{tmp_path}/$(touch PWNED)"\n')
    with pytest.raises(launch.SubmitError, match="run_root"):
        Run.dry_run(spec)
    assert not list(tmp_path.rglob("PWNED"))


def test_run_root_with_a_percent_sign_is_refused(tmp_path):
    """Slurm expands %x, %j... in --output: a run root `p%x` sent the logs to `ptiny-cpu/` (seen on
    the devcluster), so the run's logs were not where status and logs read them."""
    spec = S.loads(f'[job]\nrun_root = "{tmp_path}/p%x"\n')
    with pytest.raises(launch.SubmitError, match="'%', which Slurm expands"):
        Run.dry_run(spec)
    assert not (tmp_path / "p%x").exists()


def test_allowed_special_characters_do_not_execute(tmp_path):
    """Runs the rendered script with bash, with `srun` on PATH replaced by a stub that records its
    argv (the boundary: no Slurm needed to check the shell semantics of the script). Every
    character the allowlist lets through that means something to a shell (& | * ( ) [ ] : = @ %)
    is in a value here; tests/test_slurm_e2e.py (test_sbatch_parses_every_allowlisted_value_as_rendered)
    sends values with the same characters through `submit --dry-run` and the real sbatch's parser."""
    marker = tmp_path / "PWNED"
    job = JOB.replace('"h100&ib"', '"(h100&ib)|[a100*2]"').replace(
        'reservation = "big"', 'reservation = "big", exclude = "node[3-4]", "mail-user" = "me@x.org%"'
    )
    script, run = render(tmp_path, job)
    assert "#SBATCH --constraint='(h100&ib)|[a100*2]'" in script  # quoted; Slurm's parser unquotes
    assert "#SBATCH --exclude='node[3-4]'" in script
    bindir = tmp_path / "bin"
    bindir.mkdir()
    stub = bindir / "srun"
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "argv")}
    env.update(SLURM_JOB_ID="1", SLURM_JOB_NODELIST="node1")  # for the control plane's job steps around srun
    body = script.replace("module load cuda/12.4", "true")
    subprocess.run(["bash", "-c", body], env=env, check=True, cwd=tmp_path)
    assert not marker.exists()
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-3:] == ["-m", "submitit.core._submit", str(run.submitit_dir)]


def test_dry_run_prepares_a_run_folder_and_writes_the_script(tmp_path):
    spec = S.loads(JOB.replace("RUNROOT", str(tmp_path / "runs")))
    run, script = Run.dry_run(spec)
    assert (run.path / "sbatch.sh").read_text() == script
    assert run.folder.attempts == [] and run.folder.record().dry_run and S.load(run.folder.job_toml) == spec


def stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """Stub Slurm commands (no Slurm here; the devcluster runs the same path for real in
    tests/test_slurm_e2e.py and test_slurm_oci.py): `scontrol ping` says UP, sbatch keeps its
    argv and script and answers a job id, as Slurm does (after one "Unable to contact slurm
    controller" when $FAKE/outage exists)."""
    bindir = tmp_path / "bin"
    stub(bindir, "scontrol", 'echo "Slurmctld(primary) at head is UP"')
    stub(bindir, "srun", "exit 0")
    stub(bindir, "squeue", 'cat "$FAKE/queue" 2>/dev/null; true')
    stub(
        bindir,
        "sbatch",
        '[ "$1" = --version ] && echo "slurm 22.05.8" && exit\n'
        'echo "$*" >> "$FAKE/sbatch.argv"\n'
        'if [ -e "$FAKE/outage" ]; then rm "$FAKE/outage"\n'
        '  echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller" >&2\n'
        "  exit 1\nfi\n"
        'cp "${@: -1}" "$FAKE/submitted.sh"; echo 4242',
    )
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE", str(tmp_path))
    return tmp_path


def test_a_slurm_attempt_is_submitits_job_with_its_files(fake_slurm):
    """What submit queues on Slurm is submitit's: the batch script it wrote (running
    `submitit.core._submit` on the job's folder) sent held with a unique --comment, the pickled
    WorkerCall in submitit/<job id>/, and a submitit job object; nothing queued another way has
    these files."""
    from submitit.helpers import DelayedSubmission

    spec = S.loads(JOB.replace("RUNROOT", str(fake_slurm / "runs")))
    sub = Run.submit(spec, "slurm")
    folder = sub.run.folder
    assert sub.job_id == "4242" and [a.job_id for a in folder.attempts] == ["4242"]
    job_dir = folder.submitit_dir / "4242"
    submitted = (fake_slurm / "submitted.sh").read_text()
    assert (job_dir / "4242_submission.sh").read_text() == submitted
    call = DelayedSubmission.load(job_dir / "4242_submitted.pkl")
    assert call.function == launch.WorkerCall(str(folder.path)) and (call.args, call.kwargs) == ((), {})
    srun = next(line for line in submitted.splitlines() if line.startswith("srun "))
    assert srun.endswith(f"-u -m submitit.core._submit {folder.submitit_dir}/%j")
    assert f"--output {folder.submitit_dir}/%j/%j_%t_log.out" in srun
    (argv,) = (fake_slurm / "sbatch.argv").read_text().splitlines()
    token = argv.split("--comment=")[1].split()[0]
    assert token.startswith(f"clusterfsdp:{folder.id}:") and "--hold" in argv
    assert "#SBATCH --hold" in submitted and f"#SBATCH --comment={token}" in submitted
    assert "#SBATCH --signal=USR2@180" in submitted and "#SBATCH --requeue" in submitted


def test_submitits_sbatch_is_retried_through_a_controller_outage(fake_slurm, monkeypatch):
    """submitit runs sbatch once; here the batch file it wrote goes through slurmcli.submit, which
    waits out an unanswered controller and looks for the job by its comment before resending."""
    monkeypatch.setenv("CLUSTERFSDP_SLURM_RETRY_S", "30")
    (fake_slurm / "outage").touch()
    spec = S.loads(JOB.replace("RUNROOT", str(fake_slurm / "runs")))
    sub = Run.submit(spec, "slurm")
    assert sub.job_id == "4242" and len((fake_slurm / "sbatch.argv").read_text().splitlines()) == 2
    assert (sub.run.folder.submitit_dir / "4242" / "4242_submitted.pkl").is_file()


def test_a_refused_submission_leaves_no_submitit_files(fake_slurm, tmp_path):
    """sbatch refuses (not retried): one line, and submitit's temporary script and pickle are
    gone from the run folder of a resume (a first submit removes the whole folder)."""
    spec = S.loads(JOB.replace("RUNROOT", str(fake_slurm / "runs")))
    run = runfolder.create_run(spec, Executor.SLURM, run_id="R1")
    stub(tmp_path / "bin", "sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1')
    with pytest.raises(launch.SubmitError, match=r"^sbatch refused the job: .*Invalid account"):
        launch.queue(spec, Executor.SLURM, run)
    assert list(run.submitit_dir.iterdir()) == []


def test_the_dry_run_script_submitted_by_hand_finds_its_pickled_call(tmp_path):
    """A hand-submitted job has an id no executor saw: the job step `before` pickles the call
    where that script's `_submit` looks (once: a requeued incarnation finds it there)."""
    from submitit.helpers import DelayedSubmission

    from clusterfsdp.control import jobstep

    run, script = Run.dry_run(S.loads(JOB.replace("RUNROOT", str(tmp_path / "runs"))))
    assert script.splitlines()[-1] == 'exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"'
    assert jobstep.before(run.folder, jobstep.SlurmJob("55", 0, "node1")) == 0
    pickle = run.folder.submitit_dir / "55_submitted.pkl"
    assert DelayedSubmission.load(pickle).function == launch.WorkerCall(str(run.path))
    assert launch.write_call(run.folder, "55") is None  # there already


def test_the_worker_call_takes_the_signals_back_from_submitit(monkeypatch):
    """submitit's `_submit` installs handlers that ignore SIGTERM and requeue on SIGUSR2 just
    before it calls the pickled function; WorkerCall puts the defaults back before it imports the
    worker (whose stop flags are then installed first thing)."""
    import signal
    import types

    seen = {}

    def run(run_dir: str) -> str:
        seen.update({s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)})
        return "ok"

    fake = types.ModuleType("clusterfsdp.worker.main")
    setattr(fake, "run", run)  # noqa: B010 - a module has no declared attributes
    monkeypatch.setitem(sys.modules, "clusterfsdp.worker.main", fake)
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT)}
    try:
        for s in saved:
            signal.signal(s, lambda *_: None)  # as submitit's SignalHandler
        assert launch.WorkerCall("/x")() == "ok"
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert set(seen.values()) == {signal.SIG_DFL}


def test_wait_follows_the_attempt_that_takes_over_and_raises_submitits_error(fake_slurm):
    """Run.wait (launch.wait): while job 100 runs (stub squeue), an automatic restart records job 101; once
    100 has left the queue, wait follows 101, whose rank 0 failed: submitit's job.result() raises
    FailedJobError with the rank's traceback (read from submitit's result pickle)."""
    import pickle
    import threading
    import time

    from submitit.core.utils import FailedJobError

    stub(fake_slurm / "bin", "squeue", '[ -e "$FAKE/running" ] && echo "100|RUNNING||0:05|node1"; true')
    stub(fake_slurm / "bin", "sacct", "true")
    spec = S.loads(JOB.replace("RUNROOT", str(fake_slurm / "runs")))
    run = runfolder.create_run(spec, Executor.SLURM, run_id="W1")
    run.add_attempt("100", Executor.SLURM, "submit")
    (fake_slurm / "running").touch()
    outcome: list[BaseException | str] = []

    def waiter() -> None:
        try:
            outcome.append(Run(run).wait(poll_s=0.1))  # the run service's wait is launch.wait
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # job 100 is still running
    (run.submitit_dir / "101").mkdir()
    (run.submitit_dir / "101" / "101_0_result.pkl").write_bytes(pickle.dumps(("error", "Traceback: boom")))
    run.add_attempt("101", Executor.SLURM, "automatic restart")
    (fake_slurm / "running").unlink()
    thread.join(timeout=30)
    (error,) = outcome
    assert isinstance(error, FailedJobError) and "boom" in str(error)


def test_submission_keeps_what_finds_the_cluster_and_scrubs_the_rest(monkeypatch, tmp_path):
    """Issue 36 (found moving Slurm tests onto a second devcluster): submitit's clean_env dropped
    SLURM_CONF too, so sbatch read /etc/slurm/slurm.conf (another cluster, or none) while the
    scontrol release after it read $SLURM_CONF. The allocation's variables still go; the ones that
    name the cluster stay, and everything is as before afterwards."""
    spec = S.loads(JOB.replace("RUNROOT", str(tmp_path / "runs")))
    inherited = {"SLURM_CONF": "/site/slurm.conf", "SLURM_CLUSTERS": "b", "SLURM_JOB_ID": "7", "SRUN_DEBUG": "3"}
    for key, value in inherited.items():
        monkeypatch.setenv(key, value)
    with launch.submission_env(spec):
        seen = {k: os.environ.get(k) for k in inherited}
    assert seen == {"SLURM_CONF": "/site/slurm.conf", "SLURM_CLUSTERS": "b", "SLURM_JOB_ID": None, "SRUN_DEBUG": None}
    assert {k: os.environ.get(k) for k in inherited} == inherited
