"""Warm rank start for the tests (issue 36): one rank server per pytest process (so one per xdist
worker) imports torch, transformers and the worker once (`worker.warmstart.Launcher`, what the
local executor's controller uses) and forks each rank that `procs.launch` asks for, instead of a
fresh interpreter per rank that imports them all again (several seconds of CPU each, about 185
ranks per suite run).

The server is started on the first launch that may be forked (`shared`), runs `python -c BOOT`
with this file (it imports nothing from tests/), preloads, then listens on a Unix socket in a
private temporary folder. Per rank, the test process connects, sends the argv and environment with
the write end of the rank's output pipe (SCM_RIGHTS), and gets back the pid and a pidfd; the server
stays single-threaded, forks (or, when `warmstart.fork_problem` says a fork is unsafe, starts the
rank with Popen itself), reaps the rank and sends its exit status (-N for signal N, as Popen's
`returncode`). `ServedRank` is the test's Popen-like handle. The server exits when its parent test
process does (it checks its parent pid every second) and is stopped at exit (atexit).

A rank is started cold (Popen from the test process, as before) unless forking gives what a cold
start gives; `cold_reason` is the rule:

- `CLUSTERFSDP_TEST_COLD=1` (or the product's `CLUSTERFSDP_COLD_START=1`) in the test process's or
  the rank's environment: every rank cold, the switch to compare the two or to rule the server out;
- the command is neither `python -m MODULE ...` nor `python SCRIPT.py ...` (`-c` is not
  forked; `procs.launch` writes a `-c` rank's code to a script file): `warmstart.module_command`;
- the working directory or umask differs from the server's (a `-m` rank's sys.path[0] is its cwd);
- the environment the rank imports its modules under differs from the one the server imported them
  under in any variable but the per-rank ones in `PER_RANK`. The rank's import environment is its
  environment plus, for `clusterfsdp.worker RUN_DIR`, what `worker.main.run` sets before its heavy
  imports (`warmstart.import_environment`: HF_HUB_OFFLINE's default and the job's [env]); the
  server's is its own plus the same default. `PER_RANK` holds only what is read after start-up:
  the torch.distributed variables and the job id (read when the process group starts), the
  fault-injecting scripts' switches (CLUSTERFSDP_TEST_FAULT, _POISON, _SKIP: read by the scripts
  when they run) and the worker's all-ranks log switch (read when the rank's log opens),
  `PYTEST_CURRENT_TEST` (which pytest changes per test; read by mlflow, hypothesis and torch's and
  transformers' testing helpers, none of them preloaded) and preflight's test switch (read in
  `preflight.full_check`), and SLURM_CONF (a Slurm test's; read by the Slurm clients a rank
  starts, when they run: the reference runs of the Slurm tests were cold for it), and
  TORCHINDUCTOR_CACHE_DIR (read by inductor's `cache_dir()` when it compiles; `inductor_env`'s
  other variable, TORCHINDUCTOR_COMPILE_THREADS, which torch._inductor.config reads at import, every
  rank and the server have: `procs.ONE_THREAD`). The trackers' settings (`WANDB_*`, `MLFLOW_*`) may
  differ too: they are read by wandb, mlflow and transformers' integration_utils when imported,
  none of which the server preloads (test_rankserver checks it), and by accelerate's trackers when
  one is made (accelerate itself is preloaded: transformers imports it).

What a forked rank differs in (as in the product, worker/warmstart.py): its parent is the server,
not the test process; it shares the server's hash seed; /proc/PID/cmdline shows the rank's command
written over the server's (padded) arguments. Its stdout and stderr are buffered as a cold
interpreter buffers them (block-buffered stdout unless `-u` or PYTHONUNBUFFERED), not as warmstart's
`python -u`. A test that needs the test process as the rank's parent launches with `cold=True`.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterfsdp.core import spec as specmod
from clusterfsdp.core import warmlaunch
from clusterfsdp.core.runroot import ENV_RUN_ROOT
from clusterfsdp.worker import distenv, warmstart
from clusterfsdp.worker.main import ENV_LOG_ALL_RANKS

ENV_TEST_COLD = "CLUSTERFSDP_TEST_COLD"  # "1": every rank of procs.launch a fresh interpreter
WORKER = "clusterfsdp.worker"
# Variables a rank may have otherwise than the server (the module docstring says why each): what
# torch.distributed's rendezvous reads (distenv.DistEnv.export), the job id, pytest's and preflight's.
_DIST = distenv.DistEnv(0, 0, 1, 1, 0, 1, "", 0, "", 0, "single").export()
PER_RANK = frozenset({
    *_DIST, "CLUSTERFSDP_JOB_ID", "PYTEST_CURRENT_TEST", "CLUSTERFSDP_PREFLIGHT_TEST_FULL",
    "CLUSTERFSDP_TEST_FAULT", "CLUSTERFSDP_TEST_POISON", "CLUSTERFSDP_TEST_SKIP", ENV_LOG_ALL_RANKS,
    warmlaunch.ENV_LAUNCHER, "SLURM_CONF", "TORCHINDUCTOR_CACHE_DIR",
})  # fmt: skip
TRACKER_SETTINGS = ("WANDB_", "MLFLOW_")  # prefixes of what only the trackers' modules read (docstring)
TRACKER_MODULES = ("wandb", "mlflow", "transformers.integrations.integration_utils")  # none preloaded
# Preloaded files that name such a variable, and where they read it (not at import):
CALL_TIME_READERS = {"accelerate/tracking.py": "MLflowTracker.__init__ (MLFLOW_*), when such a tracker is made"}


def per_rank(key: str) -> bool:
    """Whether a rank's `key` may differ from the server's (the module docstring says why)."""
    return key in PER_RANK or key.startswith(TRACKER_SETTINGS)


# What a controller's environment may have otherwise than the controllers' server: what the local
# executor adds (core/localctl.RecordingExecutor): submitit's task variables, read by the controller
# as it runs, and CUDA_VISIBLE_DEVICES, read when CUDA starts (never at import); and the run root of
# `submit`'s environment (CLUSTERFSDP_RUN_ROOT: read by core/runroot when a command looks for runs).
# (The terminal's size may differ for every served process: `served_variable`.)
CONTROLLER = "clusterfsdp.worker.warmctl"


def controller_variable(key: str) -> bool:
    return key.startswith("SUBMITIT_") or key in ("CUDA_VISIBLE_DEVICES", ENV_RUN_ROOT)


# The product's preload plus the tests' model family (llama-tiny; transformers imports it on first use).
PRELOAD = (*warmstart.MODULES, "transformers.models.llama.modeling_llama")
# The server's own argument strings, long enough for a rank's command to be written over them.
PAD = "-" * 4096
BOOT = (
    "import importlib.util as u, os, sys; sys.path[0] = os.getcwd(); "  # as `python -m` sets it
    "s = u.spec_from_file_location('_rank_server', sys.argv[1]); m = u.module_from_spec(s); "
    "s.loader.exec_module(m); sys.exit(m.main(sys.argv[2:]))"
)


class ServerGone(RuntimeError):
    """The server ended (or stopped answering) while a rank of its was not known to have ended."""


class ServedRank(warmlaunch.Served):
    """A rank the server started, as a test uses a `subprocess.Popen(..., stdout=PIPE, stderr=STDOUT,
    text=True)`: the product's handle of a served process (core/warmlaunch.Served: pid, poll, wait,
    returncode, send_signal, terminate, kill), its stdout text. `forked`: whether it was forked
    (else the server's Popen). A server that ends before the rank is known to have ended raises."""

    def __init__(self, args: list[str], conn: socket.socket, reply: dict, pidfd: int, stdout: io.TextIOWrapper):
        super().__init__(int(reply["pid"]), conn, pidfd, stdout)
        self.args, self.forked = args, bool(reply["forked"])

    def __repr__(self) -> str:
        return f"<ServedRank pid={self.pid} forked={self.forked} returncode={self.returncode}>"

    def _gone(self) -> None:
        raise ServerGone(f"the rank server ended before rank {self.pid} did")


class RankServer:
    """One server process (its handle in the test process). `modules`: what it preloads;
    `thread`: a test hook that keeps a second thread running in it, so every fork is refused and
    each rank is the server's Popen (warmstart's fallback)."""

    def __init__(self, env: Mapping[str, str], cwd: str, modules: Sequence[str] = PRELOAD, thread: bool = False):
        self.env, self.cwd = dict(env), cwd
        self.dir = tempfile.mkdtemp(prefix="rankserver-")  # mode 0700: only this user connects
        self.path = os.path.join(self.dir, "socket")
        self.log = os.path.join(self.dir, "log")
        with open(self.log, "wb") as log:
            args = [__file__, self.path, json.dumps(list(modules)), "1" if thread else "0", PAD]
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, *args], env=self.env, cwd=cwd,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.umask = umask()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self, timeout: float) -> bool:
        """Whether the server listens (it preloaded), waiting up to `timeout` s; False if it ended."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def said(self) -> str:
        return Path(self.log).read_text(errors="replace")

    def start(self, argv: list[str], env: Mapping[str, str]) -> ServedRank:
        """`argv` started by the server with `env`, its stdout and stderr on one pipe to this process.
        Raises ConnectionError before the request reached the server (nothing started)."""
        read_end, write_end = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                conn.connect(self.path)
                socket.send_fds(conn, [json.dumps({"argv": argv, "env": dict(env)}).encode()], [write_end])
            except OSError as e:
                raise ConnectionError(f"the rank server did not take the request: {e}") from e
            finally:
                os.close(write_end)  # (in flight, the message holds its own copy)
            conn.settimeout(300)
            try:
                data, fds, _, _ = socket.recv_fds(conn, 4096, 1)
            except OSError as e:
                raise ServerGone(f"the rank server did not answer: {e}") from e
        except BaseException:
            conn.close()
            os.close(read_end)
            raise
        reply = json.loads(data) if data else {"error": "the rank server ended"}
        if "error" in reply:
            conn.close()
            os.close(read_end)
            for fd in fds:
                os.close(fd)
            raise ServerGone(f"{reply['error']}\n{self.said()[-2000:]}")
        return ServedRank(argv, conn, reply, fds[0], io.TextIOWrapper(open(read_end, "rb", -1)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def cold_reason(self, argv: Sequence[str], env: Mapping[str, str]) -> str:
        """Why `argv` with `env` must start cold rather than from this server ('' if it may fork)."""
        return cold_reason(argv, env, self.env, self.cwd, self.umask)


def cold_reason(argv: Sequence[str], env: Mapping[str, str], server_env: Mapping[str, str], cwd: str, mask: str) -> str:
    """Why `argv` with `env` must start cold rather than from a server that preloaded under
    `server_env` in `cwd` with umask `mask` ('' if it may fork: the module docstring's rule)."""
    for where in (os.environ, env):
        if switch := cold_switch(where):
            return switch
    command = warmstart.module_command(argv)
    if command is None:
        return "not `python -m MODULE` or a script"
    if os.getcwd() != cwd or umask() != mask:
        return "another working directory or umask than the server's"
    module, args = command
    theirs = dict(env)
    script_on_a_run = warmstart.is_script(module) and len(args) == 1 and os.path.isfile(f"{args[0]}/job.toml")
    if (module == WORKER and len(args) == 1) or script_on_a_run:  # (fault-injecting scripts run the worker)
        try:
            spec = specmod.load(Path(args[0]) / "job.toml")
        except Exception as e:  # the rank says it again, cold
            return f"its job.toml does not load ({type(e).__name__})"
        theirs.update(warmstart.import_environment(spec, theirs))
    return environment_difference(theirs, server_env, per_rank)


def environment_difference(theirs: Mapping[str, str], server_env: Mapping[str, str], may_differ) -> str:
    """Why `theirs` (a process's import environment, its job's [env] included) is not the one the
    server imported under, ignoring the variables `may_differ` accepts ('' when it is)."""
    ours = {**server_env, **warmstart.import_environment(None, server_env)}
    differ = sorted(k for k in theirs.keys() | ours.keys() if not may_differ(k) and theirs.get(k) != ours.get(k))
    return f"an import-time environment other than the server's: {', '.join(differ)}" if differ else ""


def cold_switch(env: Mapping[str, str]) -> str:
    """The switch in `env` that asks for every process cold ('' if none)."""
    return next((f"{s}=1" for s in (ENV_TEST_COLD, warmstart.ENV_COLD) if env.get(s) == "1"), "")


# What a warm launcher of `CLUSTERFSDP_LAUNCHER` serves (core/warmlaunch.py), by module: which argument
# is the run folder whose job's [env] the process sets before its imports (None: it sets none), and
# the test of its arguments. The local executor's controller (`FOLDER RUN_DIR`), `clusterfsdp export`'s
# export (`RUN_DIR --step N --to DIR ...`: HF_HUB_OFFLINE's default, no [env]) and the notebook's
# local supervisor (`_local RUN_DIR NTASKS`, started with `-u`), and `data show` (`JOB ...`, from the CLI
# and the TUI's Data view: HF_HUB_OFFLINE's default, no [env] applied before its imports).
EXPORT = "clusterfsdp.worker.export"
NOTEBOOK_LOCAL = "clusterfsdp.notebook.tasks"
DATA_SHOW = "clusterfsdp.data.show"
SERVED = {
    CONTROLLER: (1, lambda args: len(args) == 2),
    EXPORT: (None, lambda args: len(args) >= 1),
    NOTEBOOK_LOCAL: (1, lambda args: len(args) == 3 and args[0] == "_local"),
    DATA_SHOW: (None, lambda args: len(args) >= 1),
}


# What a Jupyter kernel (jupyter_client, ipykernel) sets in its environment, which a launch from a
# notebook inherits: read by ipykernel, matplotlib (MPLBACKEND), debugpy (PYDEVD_*) and by pagers and
# terminal libraries when something is shown; none of them is read by a module the server preloads
# (test_rankserver greps their files for these names).
KERNEL_VARIABLES = frozenset({"CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "GIT_PAGER", "MPLBACKEND", "PAGER", "TERM"})
KERNEL_PREFIXES = ("JPY_", "PYDEVD_")


def served_variable(module: str, argv: Sequence[str], key: str) -> bool:
    """What else a served process's environment may have otherwise than the server's: a controller's
    `controller_variable`s; a notebook kernel's `KERNEL_VARIABLES`; the terminal's size (COLUMNS,
    LINES: `clusterfsdp submit --follow` leaves them in its environment, and a pytest session
    without xdist differs in them; read when something is printed, by shutil.get_terminal_size
    and rich, never at import); for a `-u` command PYTHONUNBUFFERED (read when the interpreter
    starts, for what `-u` sets anyway: warmstart gives a forked process `-u`'s stdio)."""
    if module == CONTROLLER and controller_variable(key):
        return True
    if key in KERNEL_VARIABLES or key.startswith(KERNEL_PREFIXES) or key in ("COLUMNS", "LINES"):
        return True
    return key == "PYTHONUNBUFFERED" and argv[1:2] == ["-u"]


def served_cold_reason(request: Mapping, server_env: Mapping[str, str], server_cwd: str, mask: str) -> str:
    """Why the process asked for in `request` (core/warmlaunch.py; `SERVED`) must start cold ('' if
    the server may fork it): the rule of `cold_reason`, with two differences. Its working folder
    may differ (the child changes to it and puts it first on sys.path, as `python -m` does) unless
    a preloaded package's name is there, which a cold start would import from it instead; and the
    `served_variable`s may."""
    argv, env, cwd = list(request["argv"]), dict(request["env"]), str(request["cwd"])
    if switch := cold_switch(env):
        return switch
    command = warmstart.module_command(argv)
    if command is None or command[0] not in SERVED or not SERVED[command[0]][1](command[1]):
        return f"not one of the commands served here: {', '.join(f'python -m {m}' for m in SERVED)}"
    module, args = command
    if f"{int(request['umask']):04o}" != mask:
        return "another umask than the server's"
    if cwd != server_cwd:
        shadowed = sorted({m.split(".")[0] for m in PRELOAD} & {Path(p).stem for p in os.listdir(cwd)})
        if shadowed:
            return f"its working folder holds {', '.join(shadowed)}, which a new interpreter would import from there"
    spec = None
    if (where := SERVED[module][0]) is not None:
        try:
            spec = specmod.load(Path(args[where]) / "job.toml")
        except Exception as e:  # the process says it again, cold
            return f"its job.toml does not load ({type(e).__name__})"
    theirs = {**env, **warmstart.import_environment(spec, env)}
    return environment_difference(theirs, server_env, lambda k: per_rank(k) or served_variable(module, argv, k))


def umask() -> str:
    """This process's umask, read without setting it (os.umask would, for every thread)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    return ""


_shared: RankServer | None = None
_shared_failed = ""
_shared_lock = threading.Lock()


def shared(env: Mapping[str, str], cwd: str) -> RankServer | None:
    """This process's server, started and preloaded on the first call (the later calls get the
    same one, whatever they pass); None when it could not start (every rank cold then)."""
    global _shared, _shared_failed
    with _shared_lock:
        if _shared is None and not _shared_failed:
            _shared, _shared_failed = _started(env, cwd, "rank server: not started, every rank cold")
        return _shared


def _started(env: Mapping[str, str], cwd: str, failing: str) -> tuple[RankServer | None, str]:
    """(a server preloaded under `env` in `cwd`, '') or (None, what it said), `failing` printed then."""
    server = RankServer(env, cwd)
    atexit.register(server.stop)
    if server.ready(timeout=600):
        return server, ""
    said = server.said()[-2000:] or "no answer"
    server.stop()
    print(f"{failing}: {said}", file=sys.stderr)
    return None, said


_controllers: RankServer | None = None


def controllers(env: Mapping[str, str], cwd: str) -> RankServer | None:
    """This process's launcher of local-executor controllers (core/warmlaunch.py), started now:
    a server like the ranks' one, preloaded under `env`, the environment the `clusterfsdp`
    commands a test starts inherit (the ranks' server has OMP_NUM_THREADS=1, which torch's OpenMP
    and numpy's BLAS read at import, so it cannot fork a controller that a new interpreter would
    start without it). None when it could not start (every controller cold then)."""
    global _controllers
    with _shared_lock:
        if _controllers is None:
            _controllers, _ = _started(env, cwd, "controller launcher: not started, every controller cold")
        return _controllers


def stop_shared() -> None:
    """Stops this process's servers (the end of the test session); a later launch starts another."""
    global _shared, _controllers
    with _shared_lock:
        for server in (_shared, _controllers):
            if server is not None:
                server.stop()
        _shared = _controllers = None


def start(
    argv: list[str], env: Mapping[str, str], base_env: Mapping[str, str], cwd: str, cold: bool = False
) -> ServedRank | subprocess.Popen[str]:
    """A rank of `argv` with `env`: forked by this process's server when `cold_reason` allows it
    (the server started with `base_env` in `cwd` if it is not running yet: not for a rank that
    would start cold anyway), else a Popen."""
    if not cold and (_shared is not None or not cold_reason(argv, env, base_env, cwd, umask())):
        server = shared(base_env, cwd)
        if server is not None and not server.cold_reason(argv, env):
            try:
                return server.start(argv, env)
            except ConnectionError:
                pass  # nothing was started: cold
    return subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ---- the server process -------------------------------------------------------------------------

_sockets: list[socket.socket] = []  # the server's: detached (not closed) in a forked rank
_unbuffered = True  # whether the rank being forked runs with `-u` or PYTHONUNBUFFERED


def main(args: list[str]) -> int:
    """The server's entry point (BOOT): serves until its parent ends; in a forked child, the rank."""
    rank: warmstart.BecomeRank | None = None
    try:
        serve(args[0], json.loads(args[1]), thread=args[2] == "1")
        return 0
    except warmstart.BecomeRank as became:
        for s in _sockets:  # their fds were closed by warmstart: a later close would hit the rank's files
            s.detach()
        rank = became.with_traceback(None)
    if not _unbuffered:
        _buffered_stdio()
    rank.run()
    return 0


def serve(path: str, modules: Sequence[str], thread: bool) -> None:
    global _unbuffered
    launcher = warmstart.Launcher()
    print(f"rank server {os.getpid()}: {launcher.preload(None, modules=modules)}", flush=True)
    if thread:
        threading.Thread(target=time.sleep, args=(86400,), daemon=True).start()
    parent = os.getppid()
    server_env, server_cwd = dict(os.environ), os.getcwd()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # after the preload: never a rank's
    _sockets.append(listener)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the client connects once the name is there
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    running: dict[int, tuple[socket.socket, warmstart.Forked | subprocess.Popen[bytes]]] = {}  # by pidfd
    while os.getppid() == parent:
        for fd, _ in poller.poll(1000):
            if fd != listener.fileno():
                conn, child = running.pop(fd)
                code = child.poll()
                if code is None:  # (not yet reapable: look again)
                    running[fd] = conn, child
                    continue
                poller.unregister(fd)
                os.close(fd)
                _send(conn, {"code": code})
                continue
            conn, _ = listener.accept()
            _sockets.append(conn)
            conn.settimeout(60)
            fds: list[int] = []
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(data)
                if len(fds) not in (1, 3):
                    raise ValueError(f"{len(fds)} fds")
            except (OSError, ValueError):
                for fd in fds:
                    os.close(fd)
                _send(conn, {"error": "a bad request"})
                continue
            argv, env = request["argv"], request["env"]
            if len(fds) == 3:  # a process of `SERVED` (core/warmlaunch.py): its own stdio
                why = served_cold_reason(request, server_env, server_cwd, umask())
                stdio: dict = {"stdin": fds[0], "stdout": fds[1], "stderr": fds[2]}
                where: dict = {"cwd": request["cwd"], "start_new_session": bool(request.get("session"))}
            else:  # a test's rank: procs.launch checked the rule
                why, stdio, where = "", {"stdout": fds[0], "stderr": subprocess.STDOUT}, {}
            if why:
                for fd in fds:
                    os.close(fd)
                _send(conn, {"cold": why})
                continue
            _unbuffered = argv[1:2] == ["-u"] or bool(env.get("PYTHONUNBUFFERED"))
            try:
                child = launcher.start(argv, env, **stdio, **where)
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                _send(conn, {"error": f"starting the rank failed: {e}"})
                continue
            for fd in fds:  # (not in a `finally`: a forked rank leaves through here as BecomeRank)
                os.close(fd)
            pidfd = os.pidfd_open(child.pid)  # before this loop can reap it: the pid is the rank's
            try:
                socket.send_fds(
                    conn,
                    [json.dumps({"pid": child.pid, "forked": isinstance(child, warmstart.Forked)}).encode()],
                    [pidfd],
                )
            except OSError:
                pass  # the test process is gone: the rank is still reaped
            running[pidfd] = conn, child
            poller.register(pidfd, select.POLLIN)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.send(json.dumps(message).encode())
    except OSError:
        pass
    _sockets.remove(conn)
    conn.close()


def _buffered_stdio() -> None:
    """stdout and stderr as an interpreter started without `-u` makes them on fds that are not
    terminals: a block-buffered stdout, a line-buffered stderr (warmstart made them `-u`'s)."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        like = getattr(sys, name)
        stream = io.TextIOWrapper(
            open(fd, "wb", -1, closefd=False), like.encoding, like.errors,  # noqa: SIM115 - the rank's sys.stdout
            line_buffering=fd == 2 or os.isatty(fd),
        )  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
