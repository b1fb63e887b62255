"""Tests of the local multi-node Slurm (slurm/devcluster.sh) against the real daemons.

`.ci/run` brings the cluster up before pytest (`bash slurm/devcluster.sh up`) and down
after; the `slurm_cluster` fixture brings it up itself when it is not. Nothing here skips:
a missing daemon is a failure.

The state-folder tests need root (they chown folders to `nobody`, make device nodes) but bring
nothing up: they run `devcluster.sh status` (which only reads) or call single functions of
the script (sourced), on folders under tmp_path, never `up` or `down`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

# The `slurm_cluster` fixture comes from tests/slurm_fixtures.py, loaded for the whole
# session by conftest.py (`pytest_plugins = ["slurm_fixtures"]`, tests/ on sys.path).
from slurm_fixtures import SCRIPT, SlurmCluster

from clusterfsdp.control import devcluster

slurm = pytest.mark.slurm


# ------------------------------------------------------------------ no cluster needed


def test_script_is_found() -> None:
    assert devcluster.script_path() == SCRIPT
    assert SCRIPT.with_name("slurm.conf.in").is_file()


def test_main_refuses_non_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert devcluster.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "must run as root" in err and err.count("\n") == 1


def test_main_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert devcluster.main(["bogus"]) == 2
    assert devcluster.main(["--help"]) == 0
    assert "up | down | status" in capsys.readouterr().out


def test_parse_env_file() -> None:
    text = 'export SLURM_CONF=/x/slurm.conf\nexport CFDC_NODE_NAMES="node1 node2"\n# c\n'
    assert devcluster.parse_env_file(text) == {
        "SLURM_CONF": "/x/slurm.conf",
        "CFDC_NODE_NAMES": "node1 node2",
    }


# ------------------------------------------------------------------ the state folder (root, no cluster)

NOBODY = 65534
PARTITIONS = ["debug*", "low", "high"]  # the default, and the preemptable one and its preemptor (issue 17)


def _env(state: Path, *, path_first: Path | None = None, sudo_uid: int | None = None) -> dict[str, str]:
    """The environment for devcluster.sh with CFDC_STATE=state; `path_first` goes before PATH
    (shims of head, rm); SUDO_UID only when given."""
    env = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "CFDC_STATE", "NODES")}
    env["CFDC_STATE"] = str(state)
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    if sudo_uid is not None:
        env["SUDO_UID"] = str(sudo_uid)
    return env


def _status(state: Path, *, sudo_uid: int | None = None) -> subprocess.CompletedProcess[str]:
    """`devcluster.sh status`: it only reads (never up or down: the shared cluster)."""
    argv = ["bash", str(SCRIPT), "status"]
    return subprocess.run(argv, env=_env(state, sudo_uid=sudo_uid), capture_output=True, text=True, timeout=60)


def _sourced(snippet: str, state: Path, *, path_first: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`snippet` in bash with devcluster.sh sourced: its functions defined, nothing run."""
    argv = ["bash", "-c", f'source "$1" && {snippet}', "test", str(SCRIPT)]
    env = _env(state, path_first=path_first)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _refused(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("devcluster: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert words in proc.stderr, proc.stderr


def _owned_by_nobody(tmp: Path) -> Path:
    state = tmp / "state"
    state.mkdir()
    (state / ".clusterfsdp-devcluster").touch()  # a marker does not make it ours
    os.chown(state, NOBODY, NOBODY)
    return state


def _mode(mode: int) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / "state").mkdir()
        (tmp / "state").chmod(mode)
        return tmp / "state"

    return make


def _symlink(tmp: Path) -> Path:
    (tmp / "real").mkdir()
    (tmp / "state").symlink_to(tmp / "real")
    return tmp / "state"


def _parent(uid: int, mode: int) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / "parent").mkdir()
        (tmp / "parent").chmod(mode)
        os.chown(tmp / "parent", uid, 0)
        return tmp / "parent" / "state"

    return make


def _symlink_above(owner: int, target_owner: int) -> Callable[[Path], Path]:
    """tmp/link -> tmp/real, state at tmp/link/state: the link and its target are checked."""

    def make(tmp: Path) -> Path:
        (tmp / "real").mkdir()
        os.chown(tmp / "real", target_owner, 0)
        (tmp / "link").symlink_to(tmp / "real")
        os.lchown(tmp / "link", owner, 0)
        return tmp / "link" / "state"

    return make


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_owned_by_nobody, f"is owned by uid {NOBODY}, not root"),
        (_mode(0o777), "is writable by group or others (mode 777)"),
        (_mode(0o775), "is writable by group or others (mode 775)"),
        (_symlink, "is a symlink"),
        (_parent(NOBODY, 0o755), f"(above CFDC_STATE) is owned by uid {NOBODY}"),
        (_parent(0, 0o777), "(above CFDC_STATE) is writable by others without the sticky bit"),
        (_symlink_above(NOBODY, 0), f"link (above CFDC_STATE) is owned by uid {NOBODY}"),
        (_symlink_above(0, NOBODY), f"real (above CFDC_STATE) is owned by uid {NOBODY}"),
    ],
    ids=[
        "owner",
        "world-writable",
        "group-writable",
        "symlink",
        "parent-owner",
        "parent-writable",
        "link-above",
        "link-target-above",
    ],
)
def test_unsafe_state_folder_is_refused(tmp_path: Path, make: Callable[[Path], Path], words: str) -> None:
    """`status` (which only reads) refuses in check_settings, the same check `up` and `down`
    make before touching anything: exit 2, one line, the folder left as it was."""
    state = make(tmp_path)
    before = sorted(p.name for p in state.iterdir()) if state.is_dir() else None
    _refused(_status(state), words)
    assert (sorted(p.name for p in state.iterdir()) if state.is_dir() else None) == before


@pytest.mark.parametrize(
    "make",
    [_mode(0o755), _mode(0o700), _parent(0, 0o1777), _symlink_above(0, 0)],
    ids=["root-755", "root-700", "sticky-parent", "root-link-above"],
)
def test_safe_state_folder_is_accepted(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    proc = _status(make(tmp_path))
    assert proc.returncode == 3 and "down (no state at" in proc.stdout, proc.stdout + proc.stderr


def test_folder_above_may_belong_to_the_sudo_user(tmp_path: Path) -> None:
    state = _parent(4321, 0o755)(tmp_path)
    _refused(_status(state), "owned by uid 4321")
    proc = _status(state, sudo_uid=4321)
    assert proc.returncode == 3, proc.stdout + proc.stderr


def test_write_files_modes_and_a_munge_key_never_readable_by_others(tmp_path: Path) -> None:
    """write_files (what `up` writes before any daemon starts) on a fresh state folder. A `head`
    shim first on PATH records, while the key's bytes are being written into it, the umask and
    the mode of the file it writes to: the key is 600 from its creation, not 644 until a chmod."""
    shims, log = tmp_path / "bin", tmp_path / "head.log"
    shims.mkdir()
    (shims / "head").write_text(
        '#!/bin/bash\necho "$(umask) $(stat -L -c %a "/proc/$$/fd/1") $(readlink "/proc/$$/fd/1")" >>'
        f' {log}\nexec /usr/bin/head "$@"\n'
    )
    (shims / "head").chmod(0o755)
    state = tmp_path / "state"
    proc = _sourced("check_settings && write_files", state, path_first=shims)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    key = state / "munge" / "munge.key"
    assert log.read_text().splitlines() == [f"0077 600 {key}"]

    def mode(path: str) -> int:
        return stat.S_IMODE((state / path).stat().st_mode)

    assert key.stat().st_size == 1024 and mode("munge/munge.key") == 0o400
    assert mode("slurmdbd.conf") == 0o600 and mode("mysql") == 0o700 and mode("ctld") == 0o700
    for public in (".", "munge", "spool", "spool/node1", "log", "etc", "pids"):
        assert mode(public) == 0o755, public
    for readable in ("slurm.conf", "gres.conf", "env.sh", "etc/hosts"):  # umask 077 stayed in its subshell
        assert mode(readable) == 0o644, readable
    assert all((state / p).stat().st_uid == 0 for p in (".", "munge/munge.key", "mysql"))


def test_write_files_refuses_a_state_folder_made_by_another_user_meanwhile(tmp_path: Path) -> None:
    """`up` checks the state folder, deletes the old one, then makes it: a folder another user
    made in between (in /tmp anyone can) is refused, not filled."""
    state = tmp_path / "state"
    proc = _sourced(f"check_settings && mkdir {state} && chown {NOBODY} {state} && write_files", state)
    _refused(proc, f"is owned by uid {NOBODY}, not root")
    assert list(state.iterdir()) == []


def test_kept_logs_never_go_through_a_planted_symlink(tmp_path: Path) -> None:
    """After a failed `up` the logs are copied to STATE-failed-logs, next to the state folder.
    An `rm` shim plants a symlink there right after the old copy is removed (another user
    winning the race in /tmp): nothing is written through it."""
    state, victim, shims = tmp_path / "state", tmp_path / "victim", tmp_path / "bin"
    (state / "log").mkdir(parents=True)
    (state / "log" / "slurmctld.log").write_text("boom\n")
    victim.mkdir()
    shims.mkdir()
    (shims / "rm").write_text(f'#!/bin/bash\n/bin/rm "$@" && ln -s {victim} {state}-failed-logs\n')
    (shims / "rm").chmod(0o755)
    proc = _sourced("keep_logs", state, path_first=shims)
    assert list(victim.iterdir()) == []
    assert proc.returncode == 0 and "logs not kept" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "state-failed-logs").unlink()
    proc = _sourced("keep_logs", state)  # no race: a fresh folder with the logs
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "state-failed-logs" / "slurmctld.log").read_text() == "boom\n"


# ------------------------------------------------------------------ a second cluster (CFDC_PREFIX)


def _aliases_owned(prefix: str, aliases: list[str]) -> list[bool]:
    """has_our_alias of devcluster.sh (CFDC_PREFIX=prefix) on `ip -o link` lines with each alias."""
    lines = " ".join(f"'3: br: <UP> mtu 1500\\    alias {a}'" for a in aliases)
    snippet = f'for l in {lines}; do printf "%s\\n" "$l" | has_our_alias && echo yes || echo no; done'
    env = {**os.environ, "CFDC_PREFIX": prefix}
    proc = subprocess.run(
        ["bash", "-c", f'source "$1" && {snippet}', "t", str(SCRIPT)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return [w == "yes" for w in proc.stdout.split()]


def test_each_cluster_owns_only_its_own_bridge_alias() -> None:
    """The default cluster's bridge alias is a prefix of a second cluster's: the default's cleanup
    (which deletes every bridge carrying its alias) must not take the second cluster's bridge."""
    aliases = ["clusterfsdp-devcluster", "clusterfsdp-devcluster-b", "clusterfsdp-devcluster-bb"]
    assert _aliases_owned("", aliases) == [True, False, False]
    assert _aliases_owned("b", aliases) == [False, True, False]


def test_a_bad_prefix_is_refused_in_one_line() -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "status"], env={**os.environ, "CFDC_PREFIX": "Bad-1"}, capture_output=True, text=True
    )
    _refused(proc, "CFDC_PREFIX must be 1-4 of a-z0-9")
    assert devcluster.main(["status", "--prefix", "toolong"]) == 2


def _default_cluster_facts() -> tuple[object, ...]:
    """What a second cluster must never change of the default one (up or not): its namespaces,
    its bridge, its env.sh (rewritten by every bring-up: a new FirstJobId) and /etc/slurm/slurm.conf.
    Not its slurmctld's pid: a Slurm test's fault may restart that meanwhile."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    bridge = subprocess.run(["ip", "-o", "link", "show", "cfbr0"], capture_output=True, text=True).stdout
    env_sh = devcluster.DEFAULT_STATE / "env.sh"
    etc = Path("/etc/slurm/slurm.conf")
    return (
        sorted(line.split()[0] for line in netns.splitlines() if line.startswith("cfdc-")),
        bridge.split(": ")[:2],  # its index and name: the same bridge, not a new one
        env_sh.read_text() if env_sh.is_file() else None,
        etc.read_text() if etc.is_file() else None,
    )


def test_a_second_cluster_of_three_nodes_up_twice_restart_and_down_beside_the_default() -> None:
    """`clusterfsdp devcluster --prefix P` on a throwaway prefix (never the shared default cluster,
    whose facts are compared before and after): NODES=3 makes three nodes with their own names,
    subnet and state; a second `up` changes nothing (same daemons, same FirstJobId); `restart`
    keeps three nodes and gives a fresh cluster (new daemons and job ids, the queued job gone);
    `down` leaves nothing of it. Always taken down at the end."""
    prefix = "t" + uuid.uuid4().hex[:3]
    state = devcluster.state_dir({}, prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("CFDC_STATE", "CFDC_PREFIX", "NODES", "SLURM_CONF")}

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "clusterfsdp.cli", "devcluster", *args, "--prefix", prefix]
        proc = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def ctld_pid() -> str:
        return (state / "pids" / "slurmctld.pid").read_text()

    default = _default_cluster_facts()
    try:
        cli("up", "--nodes", "3")
        info = devcluster.read_info(state)
        assert info is not None and info.prefix == prefix and info.state == state
        assert info.nodes == ("node1", "node2", "node3") and info.bridge == f"cfbr{prefix}"
        assert info.netns == tuple(f"cfdc{prefix}-{n}" for n in ("ctl", "node1", "node2", "node3"))
        assert info.ctl_ip.startswith("10.214.") and info.slurm_conf == state / "slurm.conf"
        run = {"env": info.env(env), "capture_output": True, "text": True, "timeout": 60}
        hosts = subprocess.run(["srun", "-N3", "hostname"], **run)
        assert sorted(hosts.stdout.split()) == ["node1", "node2", "node3"], hosts.stderr
        pid, first = ctld_pid(), info.first_job_id

        again = cli("up")  # no --nodes: the running cluster is fine as it is
        assert "already up (3 nodes)" in again.stdout
        assert ctld_pid() == pid and devcluster.read_info(state) == info

        job = subprocess.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], **run)
        assert job.returncode == 0, job.stderr
        cli("restart")
        fresh = devcluster.read_info(state)
        assert fresh is not None and fresh.nodes == info.nodes and fresh.first_job_id != first
        assert ctld_pid() != pid
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], **run)
        assert queue.returncode == 0 and queue.stdout.strip() == "", queue.stdout + queue.stderr
    finally:
        cli("down")
        Path(f"/run/clusterfsdp-devcluster-{prefix}.lock").unlink(missing_ok=True)  # a throwaway name's lock
    assert not state.exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"cfdc{prefix}-" not in netns
    assert subprocess.run(["ip", "link", "show", f"cfbr{prefix}"], capture_output=True).returncode != 0
    assert _default_cluster_facts() == default


# ------------------------------------------------------------------ against the cluster


@slurm
def test_status_says_up(slurm_cluster: SlurmCluster) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "debug" in proc.stdout
    info = devcluster.read_info(slurm_cluster.state)
    assert info is not None and info.nodes == slurm_cluster.nodes
    assert len(slurm_cluster.nodes) >= 2
    assert slurm_cluster.first_job_id >= 1_000_000


@slurm
def test_srun_two_nodes_distinct_hosts_and_ips(slurm_cluster: SlurmCluster) -> None:
    script = (
        'echo "$(hostname) $(hostname -I) $(getent ahostsv4 "$(hostname)" | head -n1 | cut -d" " -f1) $SLURM_PROCID"'
    )
    out = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", script]).stdout
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert [r[0] for r in rows] == ["node1", "node2"], out
    ips = [r[1] for r in rows]
    assert ips == list(slurm_cluster.node_ips[:2]), out
    assert len(set(ips)) == 2
    # each node's own name resolves (per-namespace /etc/hosts) to its bridge IP
    assert [r[2] for r in rows] == ips, out
    assert sorted(r[3] for r in rows) == ["0", "1"]


@slurm
def test_sbatch_two_nodes_completes_in_sacct(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = slurm_cluster.sbatch(
        [
            "-N2",
            "--ntasks-per-node=1",
            "--wait",
            "-o",
            str(out),
            "--wrap",
            'echo "nodelist=$SLURM_JOB_NODELIST"; srun hostname',
        ],
        timeout=60,
    )
    assert job >= slurm_cluster.first_job_id
    text = out.read_text()
    assert "nodelist=node[1-2]" in text, text
    assert sorted(text.split()[1:]) == ["node1", "node2"], text
    assert slurm_cluster.wait_sacct(job, "COMPLETED") == "COMPLETED"


@slurm
def test_fake_gpus(slurm_cluster: SlurmCluster) -> None:
    gpus = slurm_cluster.gpus_per_node
    out = slurm_cluster.run(
        ["srun", "-N2", f"--gpus-per-node={gpus}", "sh", "-c", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"']
    ).stdout
    expected = ",".join(str(i) for i in range(gpus))
    assert sorted(out.split()) == sorted(["node1", "node2", expected, expected]), out
    too_many = slurm_cluster.run(
        ["sbatch", "-N1", "-o", "/dev/null", f"--gpus-per-node={gpus + 1}", "--wrap", "true"], check=False
    )
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


def _live_cmdlines_with(token: str) -> list[list[bytes]]:
    """argv of every live process whose command line contains `token`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(cmdline.split(b"\0"))
    return found


@slurm
def test_scancel(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    token = f"cfdc-scancel-{uuid.uuid4().hex[:8]}"
    job = slurm_cluster.sbatch(
        ["-N2", "-o", str(tmp_path / "out.txt"), "--wrap", f'srun bash -c "sleep 600; : {token}"']
    )

    # Both tasks are running: their command lines (/usr/bin/bash -c ...) carry the token. srun's
    # two processes carry it too, so only bash counts. Cancelling while a task is still being
    # launched races proctrack/linuxproc: the late task escapes the kill and slurmd drains its
    # node ("Kill task failed"), which broke every later multi-node test in one CI run.
    def tasks() -> list[list[bytes]]:
        return [argv for argv in _live_cmdlines_with(token) if argv[0].rsplit(b"/", 1)[-1] == b"bash"]

    slurm_cluster.wait_for("the job's two tasks", lambda: len(tasks()) == 2, timeout=30)
    assert slurm_cluster.squeue_state(job) == "RUNNING"
    slurm_cluster.run(["scancel", str(job)])
    assert slurm_cluster.wait_sacct(job, "CANCELLED").startswith("CANCELLED")
    slurm_cluster.wait_for("the job's processes to go", lambda: not _live_cmdlines_with(token), timeout=30)


@slurm
def test_requeue_then_start_now(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """scontrol requeue puts a running job back in the queue; StartTime=now restarts it.

    Every step waits for a state instead of assuming one: under load the node may still be
    busy from an earlier test, the scheduler runs every few seconds, and slurmdbd records
    the requeue asynchronously (sacct lags squeue)."""
    out = tmp_path / "out.txt"
    job = slurm_cluster.sbatch(
        [
            "-N1",
            "--requeue",
            "--open-mode=append",
            "-o",
            str(out),
            "--wrap",
            'echo "run restart=${SLURM_RESTART_COUNT:-0}"; sleep 600',
        ]
    )

    def printed(text: str) -> bool:
        return out.exists() and text in out.read_text()

    requeued_at = [0.0]

    def restarted() -> bool:
        # Requeued jobs wait for a begin time (cred_expire + 1 s); StartTime=now lifts it, but
        # only once the job is PENDING again, so it is (re)issued for as long as it pends. Not in
        # the first seconds after the requeue: slurmd refuses a launch whose credential is not
        # newer than the first run's revocation ("Job ... already killed, do not launch batch
        # job", seen in a CI run 0.7 s after the requeue) and the job then ends for good.
        if slurm_cluster.squeue_state(job) == "PENDING" and time.monotonic() - requeued_at[0] > 5:
            slurm_cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
        return printed("restart=1")

    try:
        slurm_cluster.wait_for("first run", lambda: printed("restart=0"), timeout=120)
        slurm_cluster.run(["scontrol", "requeue", str(job)])
        requeued_at[0] = time.monotonic()
        slurm_cluster.wait_for("second run", restarted, timeout=180, interval=1)
        assert slurm_cluster.squeue_state(job) == "RUNNING"
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)

    want = ["REQUEUED", "CANCELLED by 0"]
    slurm_cluster.wait_sacct_rows(job, lambda rows: rows == want, " then ".join(want), timeout=60)


@slurm
def test_nonexistent_partition_is_rejected(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["sbatch", "-p", "no-such-partition", "-o", "/dev/null", "--wrap", "true"], check=False)
    assert proc.returncode != 0
    assert "invalid partition" in proc.stderr.lower(), proc.stderr


@slurm
def test_namespaces_are_isolated(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.netns[0].endswith("ctl") and len(slurm_cluster.netns) == len(slurm_cluster.nodes) + 1
    subnet = slurm_cluster.ctl_ip.rsplit(".", 1)[0] + ".0/24"
    for ns in slurm_cluster.netns:
        default = slurm_cluster.run(["ip", "-n", ns, "route", "show", "default"]).stdout
        assert default.strip() == "", f"{ns} has a default route: {default}"
        routes = slurm_cluster.run(["ip", "-n", ns, "-4", "route", "show"]).stdout.split("\n")
        assert [r.split()[0] for r in routes if r.strip()] == [subnet], routes
        unreachable = slurm_cluster.run(["ip", "-n", ns, "route", "get", "1.1.1.1"], check=False)
        assert unreachable.returncode != 0


@slurm
def test_plain_sbatch_finds_the_cluster(slurm_cluster: SlurmCluster) -> None:
    """Without /etc/slurm/slurm.conf (or with one devcluster.sh wrote), `up` installs its own, so
    plain sinfo finds the cluster; someone else's is left alone (written before this bring-up,
    still not ours), and env.sh's SLURM_CONF finds the cluster either way (docs/devcluster.md)."""
    etc = Path("/etc/slurm/slurm.conf")
    ours = etc.is_file() and "clusterfsdp-devcluster" in etc.read_text().splitlines()[0]
    sourced = subprocess.run(
        ["bash", "-c", f". {slurm_cluster.state / 'env.sh'} && sinfo -h -o %P"],
        env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert sourced.returncode == 0 and sourced.stdout.split() == PARTITIONS, sourced.stdout + sourced.stderr
    if etc.exists() and not ours:  # someone else's slurm.conf: devcluster.sh must have left it alone
        assert etc.stat().st_mtime < slurm_cluster.slurm_conf.stat().st_mtime, "rewritten during our bring-up"
        assert str(slurm_cluster.state) not in etc.read_text()
        return
    assert ours, "devcluster.sh up should have installed /etc/slurm/slurm.conf"
    assert etc.read_text() == slurm_cluster.slurm_conf.read_text()
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = subprocess.run(["sinfo", "-h", "-o", "%P"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.split() == PARTITIONS, proc.stdout + proc.stderr


@slurm
def test_state_folder_modes_and_mariadb_closed_to_other_users(slurm_cluster: SlurmCluster) -> None:
    """On the running cluster: the secrets are root's alone, and an ordinary user (`nobody`) can
    still use Slurm (munge's socket and slurm.conf are reachable) but not MariaDB, whose root
    user has no password and whose server runs as root."""
    state = slurm_cluster.state

    def mode(path: str) -> int:
        return stat.S_IMODE((state / path).stat().st_mode)

    assert mode(".") == 0o755 and mode("munge") == 0o755 and mode("munge/munge.key") == 0o400
    assert mode("mysql") == 0o700 and mode("ctld") == 0o700 and mode("slurmdbd.conf") == 0o600
    as_nobody = ["runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={slurm_cluster.slurm_conf}"]
    sinfo = subprocess.run([*as_nobody, "sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30, cwd="/")
    assert sinfo.returncode == 0 and sinfo.stdout.split() == PARTITIONS, sinfo.stdout + sinfo.stderr
    socket = state / "mysql" / "mysqld.sock"
    assert socket.is_socket()
    query = [*as_nobody, "mariadb", f"--socket={socket}", "-u", "root", "-e", "select 1"]
    db = subprocess.run(query, capture_output=True, text=True, timeout=30, cwd="/")
    # ERROR 2002 (HY000): Can't connect to local server through socket '...' (13): EACCES on mysql/
    assert db.returncode != 0 and "(13)" in db.stderr, db.stdout + db.stderr
