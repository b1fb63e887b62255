"""Every Slurm path of the product, through the real daemons of the local multi-node test
cluster (slurm/devcluster.sh): sbatch, srun, squeue, sacct, scancel, scontrol requeue.

Every wait here is cut to what the test's timeout leaves (`slurm_fixtures.bounded`), and whatever
a test queued is cancelled when it ends, however it ends (slurm_fixtures' `_slurm_test_jobs`)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import CORPUS, newest_checkpoint, newest_step, weights_folder
from slurm_fixtures import bounded

from clusterfsdp.control import cost, doctor, status
from clusterfsdp.core import budget as budgetmod
from clusterfsdp.core import ckptfolder, runfolder, slurmcli
from clusterfsdp.core.records import RankOutcome

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
TWO_NODES = ["--set", "slurm.nodes=2", "--set", "slurm.tasks_per_node=2"]


@pytest.fixture(scope="session")
def _tiny_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny job's data tokenized once (here, locally) into a cache every submit of this module
    shares: a submit finds it prepared and queues no prepare array before its training job (one
    Slurm job less per submit). The array itself is tested in test_slurm_prepare.py and
    test_slurm_reference.py; a test here that changes data.* still gets one."""
    folder = tmp_path_factory.mktemp("tiny-tokens")
    job = folder / "job.toml"
    text = (REPO / "jobs" / "tiny-cpu.toml").read_text().replace('"data/corpus.txt"', f'"{CORPUS}"')
    job.write_text(text.replace("[data]\n", f'[data]\ncache_dir = "{folder / "cache"}"\n', 1))
    r = cli("data", "prepare", str(job), "--set", f"job.run_root='{folder / 'runs'}'", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return folder / "cache"


@pytest.fixture
def tiny_job(tiny_job: Path, _tiny_tokens: Path) -> Path:
    """conftest's tiny job, reading the data prepared once (_tiny_tokens)."""
    tiny_job.write_text(tiny_job.read_text().replace("[data]\n", f'[data]\ncache_dir = "{_tiny_tokens}"\n', 1))
    return tiny_job


def cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args],
        capture_output=True, text=True, timeout=bounded(timeout), env=env,
    )  # fmt: skip


def only_run(root: Path) -> runfolder.RunFolder:
    (run,) = runfolder.list_runs(root)
    return run


def wait_for(predicate, timeout: float, what: str):
    """Poll until predicate() is truthy, for `timeout` s or what the test has left if less."""
    timeout = bounded(timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_or_empty(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def max_step(run: runfolder.RunFolder) -> int:
    return max((r["step"] for r in run.metrics()), default=0)


def node_hosts(run: runfolder.RunFolder) -> set[str]:
    return {json.loads(p.read_text())["hostname"] for p in run.nodes_dir.rglob("*.json")}


def assert_every_attempt_is_submitits(run: runfolder.RunFolder) -> None:
    """Each attempt (a submit, rank 0's follow-up, the batch script's automatic restart) was queued
    by submitit's SlurmExecutor: its folder holds submitit's batch script running `_submit` and
    the pickled call (issue 26)."""
    for attempt in run.attempts:
        folder = run.submitit_dir / attempt.job_id
        script = (folder / f"{attempt.job_id}_submission.sh").read_text()
        assert "-m submitit.core._submit" in script and (folder / f"{attempt.job_id}_submitted.pkl").is_file()


@pytest.mark.parametrize("version", [2, 1])
def test_two_node_hybrid_job_completes(slurm_cluster, tiny_job, tmp_path, version):
    """FSDP2 and FSDP1 HYBRID_SHARD over two nodes. The FSDP2 run asks for the devcluster's fake
    GPUs (gres/gpu, which Slurm accounts; the ranks train on the CPU): its cost in `status` is
    what sacct's AllocTRES x ElapsedRaw says (issue 39 item 2)."""
    gpus = ["--set", "slurm.gpus_per_node=2", "--set", "slurm.max_gpu_hours=10"] if version == 2 else []
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        *TWO_NODES,
        *gpus,
        "--set",
        "fsdp.sharding=hybrid",
        "--set",
        f"fsdp.version={version}",
        "--set",
        "train.steps=40",
        "--follow",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"mesh (2, 2) (hybrid, FSDP{version})" in r.stdout and "4 ranks on 2 node(s)" in r.stdout
    run = only_run(tmp_path / "runs")
    assert node_hosts(run) == {"node1", "node2"}
    rows = run.metrics()
    assert rows[-1]["step"] == 40 and rows[0]["loss"] - rows[-1]["loss"] > 0.8
    assert newest_checkpoint(run.checkpoints_dir()).step == 40
    job_id = run.attempts[-1].job_id
    assert_every_attempt_is_submitits(run)
    assert_second_tasks_forked(run, job_id, tasks=4)
    assert slurm_cluster.wait_sacct(int(job_id), "COMPLETED")
    st = cli("status", str(run.path))
    assert st.returncode == 0 and "state      COMPLETED" in st.stdout
    row = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "AllocTRES,ElapsedRaw"]).stdout
    ((tres, seconds),) = [line.split("|") for line in row.splitlines() if line]
    gpus_alloc = int(dict(kv.split("=") for kv in tres.split(","))["gres/gpu"]) if version == 2 else 0
    assert gpus_alloc == (4 if version == 2 else 0), tres  # 2 nodes x 2 fake GPUs
    cpus_alloc = int(dict(kv.split("=") for kv in tres.split(","))["cpu"])
    gpu_h, cpu_h = gpus_alloc * int(seconds) / 3600, cpus_alloc * int(seconds) / 3600
    assert f"cost       {gpu_h:.2f} GPU-h, {cpu_h:.2f} CPU-h" in st.stdout, st.stdout
    assert f"  cost     {gpu_h:.2f} GPU-h, {cpu_h:.2f} CPU-h" in st.stdout
    if version == 2:  # the budget clock the batch script gave the workers: the allocation's 4 GPUs, 10 h
        budget = budgetmod.read_budget(run)
        assert budget is not None and (budget.gpus, budget.limit_h) == (4, 10) and budget.left_s == 10 * 3600
    spent = cost.run_cost(run)
    assert spent is not None and (spent.total.gpu_s, spent.total.cpu_s) == (
        gpus_alloc * int(seconds),
        cpus_alloc * int(seconds),
    )  # exactly sacct's GPU- and CPU-seconds
    # `runs`: the same figure in the COST column (GPU-h, or CPU-h without GPUs), kept in the run folder
    listed = cli("runs", "--run-root", str(tmp_path / "runs")).stdout
    shown = f"{gpu_h:.2f} GPU-h" if version == 2 else f"{cpu_h:.2f} CPU-h"
    assert f" {shown} slurm:{job_id} " in listed, listed
    assert json.loads((run.path / cost.CACHE_FILE).read_text())["jobs"] == {
        job_id: [[gpus_alloc * float(seconds), cpus_alloc * float(seconds)]]
    }


def batch_shell_pid(job_id: int) -> int:
    """The batch script's shell of a running job (slurmstepd runs `bash .../slurm_script`)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/slurm_script") for a in argv) and f"SLURM_JOB_ID={job_id}".encode() in env:
            return int(proc.name)
    raise AssertionError(f"no batch shell of job {job_id}")


def test_dry_run_script_submitted_by_hand_behaves_like_submit(slurm_cluster, tiny_job, tmp_path):
    """The dry run's script, sbatch'ed by hand, trains like submit. On the way it shows the end of
    an attempt as a script waiting on `status` sees it: the batch shell is stopped (SIGSTOP) while
    srun runs, so after the workers end the job stays RUNNING in Slurm with its `after` step not
    yet run; `status` (and --json) says COMPLETING, `resume` is refused naming it, and once the
    shell goes on the run is COMPLETED."""
    r = cli("submit", str(tiny_job), *TWO_NODES, "--set", "train.steps=20", "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash")
    run = only_run(tmp_path / "runs")
    assert status.run_status(run).state == "PREPARED"
    job_id = slurm_cluster.sbatch([str(run.path / "sbatch.sh")])
    wait_for(lambda: any(e.event == "start" for e in run.events()), 300, "the workers' start")
    shell = batch_shell_pid(job_id)
    os.kill(shell, signal.SIGSTOP)
    try:
        wait_for(lambda: status.run_status(run).state == "COMPLETING", 300, "COMPLETING")
        assert slurm_cluster.squeue_state(job_id) == "RUNNING"
        assert "batch script's last step is running" in status.run_status(run).reason
        doc = json.loads(cli("status", str(run.path), "--json").stdout)
        assert (doc["state"], doc["live"]) == ("COMPLETING", True)
        refused = cli("resume", str(run.path))
        assert refused.returncode == 2 and f"run {run.id} is COMPLETING" in refused.stderr, refused.stderr
    finally:
        os.kill(shell, signal.SIGCONT)
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 300, "the hand-submitted job")
    assert run.attempts[-1].job_id == str(job_id) and node_hosts(run) == {"node1", "node2"}
    assert newest_checkpoint(run.checkpoints_dir()).step == 20
    assert slurm_cluster.wait_sacct(job_id, "COMPLETED")


@pytest.mark.timeout(1500)  # attempts are slow while the other xdist worker loads both cores
def test_time_limit_signal_save_requeue_resume(slurm_cluster, tiny_job, tmp_path):
    """A 2-minute limit with a 75 s grace and more steps than an attempt can train: SIGUSR2 comes
    45-75 s after the start (Slurm's time-limit sweep runs every 30 s; a 1-minute limit left
    loaded CI machines no time to train between start-up and signal), the ranks save, rank 0
    requeues, and the next incarnation of the same job resumes from the saved step and trains
    on; then it is cancelled. One requeue and resume is what this test is about, so its cost does
    not grow with the machine's load (a fixed step count needed ever more attempts: past 600 s)."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.time=2", "--set", "slurm.signal_grace_s=75",
            "--set", "train.steps=1000000", "--set", "train.log_every=10")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    resumed = wait_for(lambda: next((e for e in run.events() if e.event == "resumed"), None), 300, "the resume")
    requeued = next(e for e in run.events() if e.event == "requeued")
    assert (requeued.cause, requeued.job_id, requeued.restart) == ("time_limit", job_id, 0)
    assert (resumed.job_id, resumed.restart, resumed.step) == (job_id, 1, requeued.step)
    wait_for(lambda: max_step(run) > (requeued.step or 0), 300, "a step logged after the resume")
    assert cli("cancel", run.id, "--run-root", str(tmp_path / "runs")).returncode == 0
    wait_for(lambda: status.run_status(run).state == "CANCELLED", 300, "the cancel")
    steps = logged_steps(run)
    assert steps == sorted(set(steps)) and steps[0] == 10  # no step lost or logged twice across the requeue
    assert {f"{job_id}.0", f"{job_id}.1"} <= {p.name for p in run.logs_dir.iterdir()}  # a log folder per incarnation
    assert len(run.attempts) == 1 and "requeued (time_limit)" in cli("status", str(run.path)).stdout


def test_requeue_refused_falls_back_to_a_follow_up_job(slurm_cluster, tiny_job, tmp_path):
    """With --no-requeue, `scontrol requeue` is refused; rank 0 submits a follow-up job
    (--dependency=afterany) that resumes from the checkpoint just saved."""
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        "slurm.requeue=false",
        "--set",
        "train.steps=150",
        "--set",
        "train.log_every=10",
    )
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    first = run.attempts[-1].job_id
    wait_for(lambda: max_step(run) >= 20, 300, "step 20")
    slurm_cluster.run(["scancel", "--signal=USR2", first])
    wait_for(lambda: len(run.attempts) == 2, 120, "the follow-up job")
    second = run.attempts[-1]
    assert second.reason.startswith("follow-up: requeue refused")
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "the follow-up to complete")
    resumed = next(e for e in run.events() if e.event == "resumed")
    assert resumed.job_id == second.job_id and resumed.step is not None and resumed.step >= 20
    assert any(e.event == "follow_up" and e.job_id_next == second.job_id for e in run.events())
    assert newest_checkpoint(run.checkpoints_dir()).step == 150
    assert_every_attempt_is_submitits(run)


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_cancel_logs_follow_and_states(slurm_cluster, tiny_job, tmp_path):
    root = str(tmp_path / "runs")
    # pending: held back by a begin time in the future
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.extra={begin='now+1hour'}")
    assert r.returncode == 0, r.stderr
    pending = only_run(tmp_path / "runs")
    assert status.run_status(pending).state == "PENDING"
    # failed: a model folder that passes the checks at submit and disappears before the job starts
    missing = weights_folder(tmp_path / "gone")
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        f"model.name_or_path='{missing}'",
        "--set",
        "model.from_config={}",
    )
    shutil.rmtree(missing)
    failed = next(x for x in runfolder.list_runs(root) if x.id != pending.id)
    # running, followed with `logs -f` until a plain scancel (not `clusterfsdp cancel`) stops it
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "train.steps=2000", "--set", "train.log_every=5")
    running = next(x for x in runfolder.list_runs(root) if x.id not in (pending.id, failed.id))
    wait_for(lambda: status.run_status(running).state == "RUNNING", 120, "RUNNING")
    follow = subprocess.Popen(
        [sys.executable, "-m", "clusterfsdp.cli", "logs", running.id, "--run-root", root, "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(lambda: max_step(running) >= 10, 300, "step 10")
    slurm_cluster.run(["scancel", running.attempts[-1].job_id])
    out, _ = follow.communicate(timeout=bounded(300))
    assert "step 10/2000" in out and "CANCELLED" in out
    # a cancel means stop: never requeued nor restarted (KillWait is 2 s here: the save may be cut short)
    assert slurm_cluster.wait_sacct(int(running.attempts[-1].job_id), "CANCELLED")
    assert len(running.attempts) == 1 and not any(e.event in ("requeued", "auto_restart") for e in running.events())
    assert all(e.cause == "cancelled" for e in running.events() if e.event == "stopped")
    wait_for(lambda: status.run_status(failed).state == "FAILED", 300, "the failed job")
    reason = status.run_status(failed).reason
    assert "FileNotFoundError" in reason and "model.name_or_path" in reason
    assert re.search(r"rank \d on node\d", reason), reason  # the failing rank and its host
    # a deterministic error (before the first step): one attempt, classified, not retried
    assert "before the first step" in reason and "not retried" in reason
    (gave_up,) = [e for e in failed.events() if e.event == "gave_up"]
    assert gave_up.cause == "error_before_first_step" and len(failed.attempts) == 1
    listing = cli("runs", "--run-root", root).stdout
    for run, state in [(pending, "PENDING"), (failed, "FAILED"), (running, "CANCELLED")]:
        line = next(row for row in listing.splitlines() if row.startswith(run.id))
        assert state in line, listing
    c = cli("cancel", pending.id, "--run-root", root)
    assert c.returncode == 0 and "scancel" in c.stdout
    wait_for(lambda: status.run_status(pending).state == "CANCELLED", 60, "CANCELLED")
    # cancelled before it started: said with who did it, by status and doctor alike (never `job N.None`)
    assert status.run_status(pending).reason == "cancelled before it started (by clusterfsdp cancel)"
    shown = cli("doctor", pending.id, "--run-root", root).stdout
    assert "cause      cancelled: cancelled before it started (by clusterfsdp cancel)" in shown, shown
    assert f"where      job {pending.attempts[-1].job_id}\n" in shown and ".None" not in shown
    jid = pending.attempts[-1].job_id
    row = wait_for(lambda: (r := slurmcli.sacct([jid]).get(jid)) and r.state == "CANCELLED" and r, 60, "sacct")
    assert row.by == str(os.getuid())  # sacct's `CANCELLED by UID`: who, for a cancel from outside
    assert slurm_cluster.squeue_state(int(pending.attempts[-1].job_id)) == ""


def test_queue_poll_is_one_batched_call_and_copes_without_sacct(slurm_cluster, tiny_job, tmp_path):
    """Wrappers in front of the real squeue/sacct count calls; a PATH without sacct is 'accounting missing'."""
    for _ in range(3):
        assert (
            cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.extra={begin='now+1hour'}").returncode
            == 0
        )
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("squeue", "sacct", "scontrol", "sbatch", "scancel"):
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        (bindir / tool).write_text(f'#!/bin/sh\necho {tool} >> {calls}\nexec {real} "$@"\n')
        (bindir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}
    r = cli("runs", "--run-root", str(tmp_path / "runs"), env=env)
    assert r.returncode == 0 and r.stdout.count("PENDING") == 3
    assert calls.read_text().split() == ["squeue"]
    (bindir / "sacct").unlink()
    for run in runfolder.list_runs(tmp_path / "runs"):
        assert cli("cancel", run.id, "--run-root", str(tmp_path / "runs"), env=env).returncode == 0
    time.sleep(2)
    r = cli("runs", "--run-root", str(tmp_path / "runs"), env=env)
    assert r.returncode == 0 and r.stdout.count("CANCELLED") == 3, r.stdout + r.stderr


def sbatch_directives(script: str) -> dict[str, str]:
    """The script's `#SBATCH --key=value` lines as {key: value}, unquoted as a shell would (what
    the renderer meant to say: its values are shell-quoted); a flag's value is ""."""
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            (out[key],) = shlex.split(value) if value else [""]
    return out


def scontrol_job(slurm_cluster, job_id: int) -> dict[str, str]:
    """`scontrol -o show job` as {field: value}: a value runs up to the next ` Field=` (the
    values compared here hold no space followed by a word and `=`)."""
    line = slurm_cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout.strip()
    return {k: v.strip() for k, v in re.findall(r"(?:^| )([A-Za-z/:_]+)=(.*?)(?= +[A-Za-z/:_]+=|$)", line)}


def ensure_account_and_qos(slurm_cluster, account: str, qos: str) -> None:
    """Accounting without enforcement silently replaces an unknown account by the user's default
    and drops an unknown QOS, so the test's own ones are made (once per cluster; idempotent)."""

    def granted() -> bool:  # a `account|qos,qos...` row for root
        out = slurm_cluster.run(["sacctmgr", "-n", "-P", "show", "assoc", "user=root", "format=account,qos"]).stdout
        return any(a == account and qos in q.split(",") for a, _, q in (ln.partition("|") for ln in out.splitlines()))

    if granted():
        return
    for argv in (["add", "qos", qos], ["add", "account", account], ["add", "user", "root", f"account={account}"],
                 ["modify", "user", "root", "where", f"account={account}", "set", f"qos+={qos}"]):  # fmt: skip
        slurm_cluster.run(["sacctmgr", "-i", *argv], check=False)  # "Nothing new added" when it exists
    slurm_cluster.wait_for("the account and QOS in slurmdbd", granted)


def test_sbatch_parses_every_allowlisted_value_as_rendered(slurm_cluster, tiny_job, tmp_path):
    """Values with every character the allowlists let through that a shell or sbatch's `#SBATCH`
    parser treats specially (& | * ( ) [ ] : = @ % + ~ , and the quotes the renderer adds around
    them), in every job.toml key that reaches an `#SBATCH` line and in the run root (the --output
    path), rendered by `submit --dry-run` and parsed by the real sbatch (a held job, never run):
    Slurm's record of the job equals, field by field, what job.toml said. Spaces, quotes,
    backslashes and `#` never reach these lines: the allowlists refuse them (tests/test_sbatch.py)."""
    account, qos, partition = "acct.x-y_z", "q.x-y_z", "debug,low"
    constraint = "(h100&ib)|[ib*2]"  # slurm/slurm.conf.in gives every node the features h100 and ib
    comment = "x&y|(z)*[w]:a=b@c%d/e+f,g.h_i-j"
    ensure_account_and_qos(slurm_cluster, account, qos)
    root = tmp_path / "r~a+b,c=d@e:f"
    extra = f"slurm.extra={{comment='{comment}', exclude='node[2]', mail-user='me+x@x.org', mail-type='END,FAIL'}}"
    r = cli("submit", str(tiny_job), "--dry-run", "--set", f"job.run_root='{root}'", "--set", "job.name=a.b_c-d",
            "--set", f"slurm.partition='{partition}'", "--set", f"slurm.account='{account}'",
            "--set", f"slurm.qos='{qos}'", "--set", f"slurm.constraint='{constraint}'", "--set", extra)  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(root)
    said = sbatch_directives((run.path / "sbatch.sh").read_text())
    assert {k: said[k] for k in ("job-name", "partition", "account", "qos", "constraint", "comment", "exclude",
            "mail-user", "mail-type")} == {"job-name": "a.b_c-d", "partition": partition, "account": account,
            "qos": qos, "constraint": constraint, "comment": comment, "exclude": "node[2]",
            "mail-user": "me+x@x.org", "mail-type": "END,FAIL"}  # fmt: skip
    assert said["output"].startswith(str(root)) and said["error"].startswith(str(root))
    job_id = slurm_cluster.sbatch(["--hold", str(run.path / "sbatch.sh")])
    got = scontrol_job(slurm_cluster, job_id)
    assert got["JobState"] == "PENDING" and got["Reason"] == "JobHeldUser", got  # held: it never runs
    slurm_cluster.run(["scancel", str(job_id)])
    expanded = {k: said[k].replace("%j", str(job_id)) for k in ("output", "error")}
    assert {
        "JobName": said["job-name"], "Partition": said["partition"], "Account": said["account"],
        "QOS": said["qos"], "Features": said["constraint"], "Comment": said["comment"],
        "MailUser": said["mail-user"], "MailType": said["mail-type"],
        "StdOut": expanded["output"], "StdErr": expanded["error"], "NumNodes": f"{said['nodes']}-{said['nodes']}",
    } == {k: got.get(k) for k in ("JobName", "Partition", "Account", "QOS", "Features", "Comment", "MailUser",
          "MailType", "StdOut", "StdErr", "NumNodes")}  # fmt: skip
    hosts = [
        slurm_cluster.run(["scontrol", "show", "hostnames", h]).stdout.split()
        for h in (said["exclude"], got["ExcNodeList"])
    ]
    assert hosts[0] == hosts[1] == ["node2"]  # Slurm writes the node list its own way: compared expanded


@pytest.mark.parametrize(
    "override,message",
    [
        ("slurm.partition=nosuch", "invalid partition"),
        # 5 nodes x 2 tasks on the 2-node, 2-CPU-per-node devcluster: Slurm 22.05 refuses the CPU count
        ("slurm.nodes=5", "more processors requested than permitted"),
        ("slurm.time='2-00:00:00'", "time limit"),
    ],
)
def test_bad_inputs_show_slurms_reason_and_leave_nothing(slurm_cluster, tiny_job, tmp_path, override, message):
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", override)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: sbatch refused the job") and message in line.lower(), line
    assert list(runfolder.list_runs(tmp_path / "runs")) == []


# ---------------------------------------------------------------- surviving the cluster (docs/recovery.md)
def logged_steps(run: runfolder.RunFolder) -> list[int]:
    return [r["step"] for r in run.metrics()]


def assert_second_tasks_forked(run: runfolder.RunFolder, job_id: str, tasks: int) -> None:
    """Two tasks per node: the rank of each node's second task (global ranks 1, 3, ...) was
    forked by its node's first task (worker/nodefork.py), which imported once; the first tasks
    started as srun made them; every task wrote submitit's result file with the rank's outcome."""
    folder = run.submitit_dir / job_id
    for task in range(tasks):
        err = (folder / f"{job_id}_{task}_log.err").read_text()
        forked = f"warm start: the rank of task {task} (pid" in err and "forked by this node's first task" in err
        assert forked == (task % 2 == 1), (task, err[-2000:])
        assert "cold start" not in err, err[-2000:]
        with open(folder / f"{job_id}_{task}_result.pkl", "rb") as f:
            assert pickle.load(f) == ("success", RankOutcome.COMPLETED)


def worker_pids(run: runfolder.RunFolder, job_id: str, rank: int | None = None) -> list[int]:
    """The worker processes of a run's job (the devcluster's nodes share this machine's pid space)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        # each srun task runs submitit's `_submit` on the run's submitit folder (launch.slurm_executor)
        task = b"submitit.core._submit" in argv and str(run.submitit_dir / "%j").encode() in argv
        if not task or b"srun" in argv[0]:
            continue
        if env.get(b"SLURM_JOB_ID") == job_id.encode() and rank in (None, int(env.get(b"SLURM_PROCID", b"-1"))):
            out.append(int(proc.name))
    return out


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_preemption_by_a_high_priority_job_saves_requeues_and_resumes(slurm_cluster, tiny_job, tmp_path):
    """A run in `low` (PreemptMode=REQUEUE, GraceTime=30) is preempted by a job in `high`: its ranks
    get SIGTERM, save together, rank 0 tells the preemption from a cancel (scontrol: PreemptTime)
    and requeues; the run resumes where it saved and completes with every logged step once."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", *TWO_NODES, "--set", "slurm.partition=low",
            "--set", "train.steps=100", "--set", "train.log_every=5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: max_step(run) >= 10, 300, "step 10")
    high = slurm_cluster.sbatch(["-p", "high", "-N1", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 3"])
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "completion after the preemption")
    (requeued,) = [e for e in run.events() if e.event == "requeued"]
    assert requeued.cause == "preempted" and (requeued.step or 0) >= 10 and "(SIGTERM)" in requeued.reason
    (resumed,) = [e for e in run.events() if e.event == "resumed"]
    assert (resumed.job_id, resumed.restart, resumed.step) == (job_id, 1, requeued.step)
    assert logged_steps(run) == list(range(5, 101, 5))  # saved at the preemption: no step lost, none redone
    assert len(run.attempts) == 1
    rows = slurm_cluster.wait_sacct_rows(job_id, lambda r: len(r) == 2 and r[-1] == "COMPLETED", "2 rows")
    assert rows[0] == "REQUEUED" and slurm_cluster.wait_sacct(high, "COMPLETED")
    assert "requeued (preempted)" in cli("status", str(run.path)).stdout


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_controller_outages_and_a_killed_rank_are_survived(slurm_cluster, tiny_job, tmp_path):
    """slurmctld stopped for 20 s during `submit` (it waits, then queues exactly one job) and
    during the requeue after a SIGUSR2 (rank 0 retries until the controller is back); then one
    rank SIGKILLed: the batch script's job step classifies it and submits a new attempt, which
    resumes from the last checkpoint and completes with every logged step."""
    env = {**os.environ, "CLUSTERFSDP_SLURM_RETRY_S": "120"}
    argv = [sys.executable, "-m", "clusterfsdp.cli", "submit", str(tiny_job), "--executor", "slurm",
            "--set", "train.steps=160", "--set", "train.log_every=5", "--set", "checkpoint.every_steps=20"]  # fmt: skip
    slurm_cluster.fault("ctld-stop")
    try:
        submit = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(20)
    finally:
        slurm_cluster.fault("ctld-start")
    _, err = submit.communicate(timeout=bounded(180))
    assert submit.returncode == 0, err
    assert "Slurm does not answer" in err and "retrying" in err
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    queued = slurm_cluster.run(["squeue", "-h", "-o", "%i %k"]).stdout
    assert [line.split()[0] for line in queued.splitlines() if run.id in line] == [job_id]  # one job, not two

    wait_for(lambda: max_step(run) >= 10, 300, "step 10")
    log0_path = run.logs_dir / f"{job_id}.0" / "rank0.log"
    slurm_cluster.fault("ctld-stop")  # before the signal: the requeue must meet a controller that is down
    try:
        for pid in worker_pids(run, job_id):
            os.kill(pid, signal.SIGUSR2)
        wait_for(lambda: "Slurm does not answer" in read_or_empty(log0_path), 120, "rank 0 to retry the requeue")
    finally:
        slurm_cluster.fault("ctld-start")
    wait_for(lambda: any(e.event == "resumed" and e.restart == 1 for e in run.events()), 300, "the requeued job")
    log0 = log0_path.read_text()
    assert "Slurm does not answer" in log0, log0[-2000:]
    (requeued,) = [e for e in run.events() if e.event == "requeued"]
    assert requeued.cause == "time_limit" and requeued.job_id == job_id

    wait_for(lambda: newest_step(run) >= (requeued.step or 0) + 20, 300, "a new checkpoint")
    (victim,) = worker_pids(run, job_id, rank=1)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "completion after the automatic restart")
    (restart,) = [e for e in run.events() if e.event == "auto_restart"]
    assert restart.cause == "rank_killed" and restart.job_id == job_id and "rank(s) 1 died" in restart.reason
    assert [a.job_id for a in run.attempts] == [job_id, restart.job_id_next]
    assert run.attempts[-1].cause == "rank_killed"
    assert_every_attempt_is_submitits(run)
    assert set(logged_steps(run)) == set(range(5, 161, 5))  # every step; those after the checkpoint twice
    assert slurm_cluster.wait_sacct(job_id, "FAILED")
    assert "auto_restart (rank_killed)" in cli("status", str(run.path)).stdout


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_a_frozen_rank_is_found_its_stacks_dumped_and_the_run_completes(slurm_cluster, tiny_job, tmp_path):
    """Two nodes, one rank each; rank 1 SIGSTOPped at step 60: a node watchdog records a `hang`
    naming rank 1 and its node (within 2 minutes of the freeze), leaves both ranks' stacks under
    diagnostics/ (py-spy read the stopped one), kills the attempt (the stopped process too), and
    the batch script's job step restarts it (`hang`) from the step-60 checkpoint: the run
    completes by itself with every logged step (docs/recovery.md, "Hangs and stragglers")."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.nodes=2", "--set", "slurm.tasks_per_node=1",
            "--set", "train.steps=100", "--set", "train.log_every=5", "--set", "checkpoint.every_steps=20",
            "--set", "train.watchdog.hang_min_s=15")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: newest_step(run) >= 60, 240, "the step-60 checkpoint")
    (victim,) = worker_pids(run, job_id, rank=1)
    os.kill(victim, signal.SIGSTOP)
    frozen_at = time.time()
    hang = wait_for(lambda: next((e for e in run.events() if e.event == "hang"), None), 150, "the hang event")
    assert hang.ranks == [1] and hang.rank == 1 and hang.time - frozen_at < 120, hang
    assert "stopped answering" in hang.reason and "stopped (SIGSTOP)" in hang.reason
    assert hang.host in node_hosts(run) and not hang.failed_nodes
    for rank in (0, 1):
        dump = (run.path / "diagnostics" / f"{job_id}.0" / f"rank{rank}.txt").read_text()
        assert '"MainThread"' in dump and "worker/train.py:" in dump, dump  # inside Trainer.run
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 300, "completion after the restart")
    (restart,) = [e for e in run.events() if e.event == "auto_restart"]
    assert restart.cause == "hang" and restart.job_id == job_id, restart
    assert set(logged_steps(run)) == set(range(5, 101, 5))
    assert "hang" in cli("status", str(run.path)).stdout


def test_a_submission_the_hung_controller_processes_late_is_not_duplicated(slurm_cluster, tmp_path, monkeypatch):
    """A hung slurmctld (SIGSTOP): sbatch times out, yet the controller queues the job when it wakes
    (seen on the devcluster). The retry finds it by its --comment instead of queueing a second one."""
    from clusterfsdp.core import retrynotes, slurmcli

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n")
    token = f"clusterfsdp:dedup-test:{os.getpid()}"
    result: list[str] = []
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    notes: list[str] = []
    slurm_cluster.fault("ctld-freeze")
    try:

        def submit() -> None:
            with retrynotes.retry_notices(notes.append):
                result.append(slurmcli.submit(script, token))

        worker = threading.Thread(target=submit)
        worker.start()
        # until sbatch gave up once (its 10 s MessageTimeout) and slurmcli said it retries
        slurm_cluster.wait_for("the first sbatch to time out", lambda: notes, timeout=120, interval=0.5)
    finally:
        slurm_cluster.fault("ctld-thaw")
    worker.join(timeout=bounded(120))
    try:
        assert notes and "Socket timed out" in notes[0], notes  # the first sbatch went unanswered
        assert result and slurmcli.jobs_with_token(token) == result
    finally:
        for job in slurmcli.jobs_with_token(token):
            slurmcli.scancel(job)


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_a_failed_node_is_left_out_and_the_run_resumes_on_the_remaining_node(slurm_cluster, tiny_job, tmp_path):
    """node2 dies (its slurmd and every process on it) during a 2-node HSDP run. With --no-kill the
    job lives on on node1 until Slurm declares node2 down (SlurmdTimeout=30 s); the batch script's
    job step then submits the next attempt without node2, on 1 node with twice the gradient
    accumulation (the same global batch), which resumes and completes (4 ranks -> 2)."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", *TWO_NODES, "--set", "fsdp.sharding=hybrid",
            "--set", "train.steps=100", "--set", "train.log_every=5", "--set", "checkpoint.every_steps=10")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    try:
        wait_for(lambda: ckptfolder.find(run.checkpoints_dir()), 300, "a first checkpoint")
        slurm_cluster.fault("node-kill", "node2")
        wait_for(lambda: status.run_status(run).state == "COMPLETED", 900, "completion on the remaining node")
    finally:
        slurm_cluster.fault("node-start", "node2")
    (restart,) = [e for e in run.events() if e.event == "auto_restart"]
    assert restart.cause == "node_failure" and restart.failed_nodes == ["node2"]
    second = run.attempts[-1]
    assert (second.cause, second.exclude) == ("node_failure", ["node2"]) and second.job_id != job_id
    spec = run.spec()
    assert (spec.slurm.nodes, spec.train.grad_accum, spec.effective_sharding) == (1, 2, "full")
    assert "saved by 4 ranks, now 2" in (run.logs_dir / f"{second.job_id}.0" / "rank0.log").read_text()
    assert node_hosts(run) == {"node1", "node2"} and set(logged_steps(run)) == set(range(5, 101, 5))


def test_a_node_that_fails_its_preflight_is_left_out_and_the_run_completes_on_the_other(
    slurm_cluster, tiny_job, tmp_path
):
    """The pre-flight's test hook (worker/preflight.py) makes node2's checkpoint folder look full:
    every rank stops before step 1 with one line naming node2 and why; the batch script submits
    the next attempt without node2 (a restart of slurm.max_restarts), on 1 node with twice the
    gradient accumulation, which completes. status and doctor show the line; the node records keep
    every check and the all-reduce bandwidth."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", *TWO_NODES, "--set", "train.steps=20",
            "--set", "train.log_every=5", "--set", "env.CLUSTERFSDP_PREFLIGHT_TEST_FULL=node2")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 150, "completion on node1")
    line = f"pre-flight failed on node2: checkpoint space: {run.checkpoints_dir()} has 0.00 GiB free, needs"
    (restart,) = [e for e in run.events() if e.event == "auto_restart"]
    assert restart.cause == "preflight" and restart.failed_nodes == ["node2"] and restart.restarts == 1
    assert line in restart.reason and "; without node2; on 1 node(s)" in restart.reason, restart.reason
    second = run.attempts[-1]
    assert (second.cause, second.exclude) == ("preflight", ["node2"]) and second.job_id != job_id
    assert (run.spec().slurm.nodes, run.spec().train.grad_accum) == (1, 2)
    first = {p.stem: json.loads(p.read_text())["preflight"] for p in (run.nodes_dir / f"{job_id}.0").glob("*.json")}
    assert {h: [c["ok"] for c in r["checks"]] for h, r in first.items()} == {
        "node1": [True] * 4, "node2": [True, False, True, True]}  # fmt: skip
    (then,) = [json.loads(p.read_text())["preflight"] for p in (run.nodes_dir / f"{second.job_id}.0").glob("*.json")]
    assert then["passed"] and then["host"] == "node1" and then["busbw_gbps"] > 0
    assert line in cli("status", str(run.path)).stdout
    (earlier,) = doctor.diagnose(run).earlier  # the run completed: the doctor sums up the attempt before
    assert earlier.startswith(f"job {job_id}.0: preflight: pre-flight failed on node2: checkpoint space: "), earlier
    assert set(logged_steps(run)) == set(range(5, 21, 5))
    # node2 stays bad (issue 39 item 4): the cluster's node record names it, and the next run (a dry
    # run's script: the pre-flight is not run again) leaves it out until `nodes clear` brings it back
    listed = json.loads(cli("nodes", "--json", "--run-root", str(tmp_path / "runs")).stdout)
    assert [(m["node"], m["cause"], m["run"]) for m in listed["quarantined"]] == [("node2", "preflight", run.id)]
    assert Path(listed["record"]).parent == tmp_path / "runs" / ".nodes"
    r = cli("submit", str(tiny_job), "--dry-run")
    assert r.returncode == 0 and "#SBATCH --exclude=node2" in r.stdout, r.stdout + r.stderr
    r = cli("nodes", "clear", "node2", "--run-root", str(tmp_path / "runs"))
    assert r.returncode == 0 and "cleared node2" in r.stdout, r.stderr
    r = cli("submit", str(tiny_job), "--dry-run")
    assert r.returncode == 0 and "--exclude" not in r.stdout, r.stdout


@pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
def test_the_batch_hosts_death_is_requeued_by_slurm_and_resumes_on_the_other_node(slurm_cluster, tiny_job, tmp_path):
    """The node running a 1-node job's batch script dies (its slurmd and every process on it).
    Slurm declares it down (SlurmdTimeout=30 s), ends the job NODE_FAIL and requeues it (--requeue);
    the next incarnation, on the other node, records `slurm_requeued` with the cause read from
    sacct (`node_failure`), resumes from the newest checkpoint and completes (docs/recovery.md)."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "train.steps=60", "--set", "train.log_every=5",
            "--set", "checkpoint.every_steps=10")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: ckptfolder.find(run.checkpoints_dir()), 240, "a first checkpoint")
    host = slurm_cluster.run(["squeue", "-h", "-j", job_id, "-o", "%B"]).stdout.strip()
    assert host in slurm_cluster.nodes, host
    try:
        slurm_cluster.fault("node-kill", host)
        wait_for(lambda: status.run_status(run).state == "COMPLETED", 420, "completion on the other node")
    finally:
        slurm_cluster.fault("node-start", host)
    (requeued,) = [e for e in run.events() if e.event == "slurm_requeued"]
    assert (requeued.cause, requeued.job_id, requeued.restart) == ("node_failure", job_id, 0), requeued
    assert "failed; Slurm requeued the job" in requeued.reason
    (resumed,) = [e for e in run.events() if e.event == "resumed"]
    assert (resumed.job_id, resumed.restart) == (job_id, 1)
    assert resumed.step == requeued.step and (resumed.step or 0) >= 10
    assert len(run.attempts) == 1 and host in node_hosts(run) and len(node_hosts(run)) == 2  # then the other
    assert set(logged_steps(run)) == set(range(5, 61, 5))
    assert slurm_cluster.wait_sacct_rows(job_id, lambda r: r[:1] == ["NODE_FAIL"] and r[-1] == "COMPLETED", "rows")


def test_the_same_error_at_the_same_step_twice_is_not_retried(slurm_cluster, tiny_job, tmp_path):
    """A Python error after the first step (rank 0 cannot create the step-10 checkpoint's staging
    folder: a file is in the way) fails the attempt; the batch script retries it once (`error`), the
    new attempt fails the same way at the same step, and that is `repeated_error`: not retried,
    the run FAILED (docs/recovery.md)."""
    r = cli("submit", str(tiny_job), "--dry-run", "--set", "train.steps=40", "--set", "train.log_every=5",
            "--set", "checkpoint.every_steps=10")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    blocker = run.checkpoints_dir() / ".step-00000010.partial"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder\n")  # planted before the job exists: no race with the ranks
    slurm_cluster.sbatch([str(run.path / "sbatch.sh")])
    wait_for(lambda: status.run_status(run).state == "FAILED" and len(run.attempts) == 2, 420, "the second failure")
    (restart,) = [e for e in run.events() if e.event == "auto_restart"]
    assert restart.cause == "error" and "FileExistsError" in restart.reason
    wait_for(lambda: any(e.event == "gave_up" for e in run.events()), 60, "the verdict on the second attempt")
    (gave_up,) = [e for e in run.events() if e.event == "gave_up"]
    assert gave_up.cause == "repeated_error" and gave_up.job_id == restart.job_id_next == run.attempts[-1].job_id
    assert "again at step 10" in gave_up.reason and "not retried" in gave_up.reason
    assert gave_up.signature == restart.signature
    assert "not retried: the same error at the same step as the attempt before" in cli("status", str(run.path)).stdout


def test_a_run_out_of_restarts_ends_failed_on_slurm(slurm_cluster, tiny_job, tmp_path):
    """slurm.max_restarts = 0: a rank SIGKILLed (`rank_killed`, which costs a restart) ends the run
    FAILED with `restarts_exhausted` instead of a new attempt; `resume` is the way on."""
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.max_restarts=0",
            "--set", "train.steps=2000", "--set", "train.log_every=5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: max_step(run) >= 5, 240, "step 5")
    (victim,) = worker_pids(run, job_id, rank=1)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: status.run_status(run).state == "FAILED", 240, "FAILED")
    (gave_up,) = [e for e in run.events() if e.event == "gave_up"]
    assert gave_up.cause == "restarts_exhausted" and gave_up.job_id == job_id, gave_up
    assert "rank(s) 1 died" in gave_up.reason and "slurm.max_restarts = 0" in gave_up.reason
    assert len(run.attempts) == 1 and not any(e.event == "auto_restart" for e in run.events())
    assert slurm_cluster.wait_sacct(job_id, "FAILED")
    assert "not restarted: slurm.max_restarts used up" in cli("status", str(run.path)).stdout


def test_a_run_that_waits_says_why_and_when(slurm_cluster, tiny_job, tmp_path):
    """Issue 39 item 1: with both nodes held by another job, `submit --dry-run` says when the job
    would start (sbatch --test-only) and, with both nodes reserved from 6 min on, that a shorter
    slurm.time starts it earlier (Slurm's own test), and a 2-node run's `status` says why it waits in words
    (Resources) and when the backfill scheduler expects it to start (squeue --start). Nothing
    trains: the run is cancelled while it waits."""
    blocker = slurm_cluster.sbatch(["--nodes=2", "--exclusive", "--time=3", "--wrap", "sleep 170", "-o", "/dev/null"])
    wait_for(lambda: slurm_cluster.squeue_state(blocker) == "RUNNING", 30, "the blocking job to run")
    synthetic = [*TWO_NODES, "--set", "data.source=synthetic", "--set", "data.paths=[]"]  # (no prepare job first)
    r = cli("submit", str(tiny_job), *synthetic, "--dry-run")
    assert r.returncode == 0, r.stderr
    m = re.search(r"# would start at (\S+ \S+) on node\[1-2\] \(partition debug\)", r.stderr)
    assert m and "# sooner" not in r.stderr, r.stderr  # (no shorter limit starts it before the blocker ends)
    # both nodes reserved from 6 min on: a job of 10 min (tiny-cpu's slurm.time) finds no start in Slurm's test
    # (it runs into the reservation), a shorter one starts when the blocker ends: the dry run says so
    resv = ["ReservationName=cfsdp-sooner", "StartTime=now+6minutes", "Duration=10", "Nodes=node[1-2]", "Users=root"]
    slurm_cluster.run(["scontrol", "create", "reservation", *resv])
    try:
        r = cli("submit", str(tiny_job), *synthetic, "--dry-run")
    finally:
        slurm_cluster.run(["scontrol", "delete", "ReservationName=cfsdp-sooner"], check=False)
    tip = re.search(r"# sooner: --set slurm.time=(\d+) would start it at (\S+ \S+) \(sbatch --test-only; with its 10 "
                    r"min Slurm finds no start: allocation failure", r.stderr)  # fmt: skip
    assert r.returncode == 0 and tip and int(tip[1]) < 10 and tip[2] == m[1], r.stderr
    r = cli("submit", str(tiny_job), "--executor", "slurm", *synthetic)
    assert r.returncode == 0, r.stderr
    (run,) = [f for f in runfolder.list_runs(tmp_path / "runs") if f.record().attempts]
    pending = wait_for(lambda: (st := status.run_status(run)).state == "PENDING" and st.reason, 30, "a reason")
    assert pending == "Resources: the nodes it needs are busy; it starts when enough are free"  # (Slurm: Resources)

    def estimated() -> str:
        out = cli("status", str(run.path)).stdout
        return out if "expected   start 20" in out else ""

    out = wait_for(estimated, 90, "the backfill scheduler's start estimate")  # (a backfill cycle is 30 s)
    assert "state      PENDING - Resources: the nodes it needs are busy" in out, out
    assert cli("cancel", str(run.path)).returncode == 0
