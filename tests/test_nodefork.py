"""A Slurm node's sibling ranks forked from its first task (worker/nodefork.py), without Slurm:
real processes with a step's variables play one node's tasks, so each way a rank can end is
seen from its waiting task (the outcome, an error, an exit status, a signal, the waiting task
killed). The path through srun, submitit and the worker is test_slurm_e2e's two-node hybrid
runs (`assert_second_tasks_forked`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterfsdp.worker import distenv, nodefork

TASKS = 6  # the first task and five others, one per way of ending

# A task of the node: `python SCRIPT FOLDER`; SLURM_LOCALID 0 gathers and forks, the others ask.
# A forked rank's body ends as its task number says; each waiting task writes how it saw that end.
TASK = """
import os, signal, sys, time
from pathlib import Path
from clusterfsdp.core.records import RankOutcome
from clusterfsdp.worker import distenv, nodefork
folder = Path(sys.argv[1])
node = nodefork.Node.of(distenv.from_environ(), os.environ)
task = int(os.environ["SLURM_PROCID"])

def body():
    me = int(os.environ["SLURM_PROCID"])
    (folder / f"rank{me}.pid").write_text(f"{os.getpid()} {os.getppid()}")
    if me == 1:
        return RankOutcome.STOPPED
    if me == 2:
        raise ValueError("a bad batch")
    if me == 3:
        sys.exit(3)
    if me == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # 5: its waiting task is killed

if node.first:
    gathering = nodefork.Gathering.listen(node)
    gathering.fork_ranks(body)
    import threading
    deadline = time.monotonic() + 90  # (a first task trains meanwhile: its reapers send each rank's end)
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    (folder / "first.done").write_text("")
    sys.exit(0)
sibling = nodefork.Sibling.ask(node)
if sibling is None:
    (folder / f"task{task}.cold").write_text("")
    sys.exit(0)
(folder / f"task{task}.forked").write_text(str(sibling.pid))
try:
    outcome = sibling.result()
except RuntimeError as e:
    (folder / f"task{task}.end").write_text(f"error {e}")
    raise SystemExit(1)
(folder / f"task{task}.end").write_text(f"outcome {outcome}")
"""


def step_env(task: int, tasks: int = TASKS, job: str = "4242") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_")) and k != "TMPDIR"}
    env.update({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
                "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "nodeX", "SLURM_JOB_NODELIST": "nodeX",
                "SLURM_STEP_TASKS_PER_NODE": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
                "SLURMD_NODENAME": f"nodeX{os.getpid()}", "SLURM_TASK_PID": str(1000 + task)})  # fmt: skip
    if task == 0:
        env["TMPDIR"] = "/tmp"  # (slurmstepd sets it for a node's first task only)
    return env


def test_each_way_a_forked_rank_ends_reaches_its_waiting_task(tmp_path: Path) -> None:
    """Five tasks ask the first one: each rank was forked by it (its parent), and its task ends
    as a cold rank would have: the outcome returned, the error raised again, exit status 3, killed
    by SIGKILL; a waiting task that is killed takes its rank with it."""
    script = tmp_path / "task.py"
    script.write_text(TASK)
    tasks = [subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=step_env(t), stderr=subprocess.PIPE,
                              text=True) for t in range(TASKS)]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank5.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        rank5 = int((tmp_path / "rank5.pid").read_text().split()[0])
        tasks[5].kill()  # the waiting task of rank 5
        codes = [t.wait(timeout=60) for t in tasks]
        errs = [t.stderr.read() if t.stderr else "" for t in tasks]
    finally:
        for t in tasks:
            t.kill()
    assert codes[0] == 0 and (tmp_path / "first.done").exists(), errs[0]
    first = tasks[0].pid
    for t in range(1, TASKS):
        pid, parent = map(int, (tmp_path / f"rank{t}.pid").read_text().split())
        assert parent == first and pid == int((tmp_path / f"task{t}.forked").read_text()), t
        assert "was forked by this node's first task" in errs[t] and "cold start" not in errs[t], errs[t]
    assert (tmp_path / "task1.end").read_text() == "outcome stopped" and codes[1] == 0
    assert codes[2] == 1 and "error rank (pid" in (tmp_path / "task2.end").read_text()
    assert "ValueError: a bad batch" in (tmp_path / "task2.end").read_text()
    assert codes[3] == 3 and not (tmp_path / "task3.end").exists()
    assert codes[4] == -signal.SIGKILL and not (tmp_path / "task4.end").exists()
    assert codes[5] == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while Path(f"/proc/{rank5}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{rank5}").exists()  # (reaped by the first task's reaper, or gone with it)


def test_a_task_whose_environment_differs_starts_cold_and_says_why(tmp_path: Path) -> None:
    """A variable that is not a per-task one differs: the first task forks nothing for that task,
    which starts its rank cold (Sibling.ask returns None) and names the variable."""
    script = tmp_path / "task.py"
    script.write_text(TASK)
    envs = [step_env(t, tasks=2, job="4343") for t in range(2)]
    envs[1]["OMP_NUM_THREADS"] = "7"
    tasks = [subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=e, stderr=subprocess.PIPE, text=True)
             for e in envs]  # fmt: skip
    codes = [t.wait(timeout=60) for t in tasks]
    err = tasks[1].stderr.read() if tasks[1].stderr else ""
    assert codes == [0, 0] and (tmp_path / "task1.cold").exists()
    assert "cold start: its environment differs from the first task's in OMP_NUM_THREADS" in err, err


def test_where_ranks_are_forked_and_what_may_differ() -> None:
    """Only a Slurm step with several tasks on the node, no GPU device, no memory binding, outside
    a container, unless CLUSTERFSDP_COLD_START=1; the rendezvous is the same for the tasks of one
    node and step, another for the next restart or step. Tasks may differ in the per-task
    variables and in TMPDIR unset against /tmp."""
    env = step_env(1, tasks=2)
    node = nodefork.Node.of(distenv.from_environ(env), env)
    if Path("/dev/nvidia0").exists():
        assert node is None
        return
    assert node is not None and not node.first and node.local_tasks == 2
    first = step_env(0, tasks=2)
    assert nodefork.Node.of(distenv.from_environ(first), first) == nodefork.Node(node.name, 0, 2)
    for change in ({"CLUSTERFSDP_COLD_START": "1"}, {"SLURM_MEM_BIND_TYPE": "local"}, {"SLURM_CONTAINER": "b"},
                   {"SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_NUM_TASKS": "1"}):  # fmt: skip
        changed = {**env, **change}
        assert nodefork.Node.of(distenv.from_environ(changed), changed) is None, change
    for change in ({"SLURM_RESTART_COUNT": "1"}, {"SLURM_STEP_ID": "1"}):
        changed = {**env, **change}
        other = nodefork.Node.of(distenv.from_environ(changed), changed)
        assert other is not None and other.name != node.name
    local = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    local.update({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_ID": "1",
                  "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1"})  # fmt: skip
    assert nodefork.Node.of(distenv.from_environ(local), local) is None
    assert nodefork.env_difference(first, env) == []
    assert nodefork.env_difference(first, {**env, "TMPDIR": "/scratch"}) == ["TMPDIR"]
    assert nodefork.env_difference(first, {**env, "HF_HOME": "/x"}) == ["HF_HOME"]


@pytest.mark.parametrize("name_len", [20, 300])
def test_a_long_node_name_still_makes_an_abstract_socket_name(name_len: int) -> None:
    env = {**step_env(0, tasks=2), "SLURMD_NODENAME": "n" * name_len}
    node = nodefork.Node.of(distenv.from_environ(env), env)
    if node is not None:
        assert len(node.address) <= 107
        gathering = nodefork.Gathering.listen(node)
        assert gathering is not None
        gathering.sock.close()
