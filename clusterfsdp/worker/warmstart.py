"""Warm rank start (issue 36): the process that launches a machine's ranks imports torch,
transformers and the worker once, then forks each rank from itself, instead of starting one
fresh interpreter per rank that imports them all again (about 85% of a tiny local run was that
start-up). Used by the local executor's controller (`worker/warmctl.py`) and the notebook's local
supervisor (`notebook/tasks.py`), and on a Slurm CPU node by its first task for the node's other
tasks (`worker/nodefork.py`); every other Slurm rank starts cold (its imports frozen the same way,
below).

A forked rank must be what a cold-started one is, so the child, before it runs a line of the rank:

- gets the rank's stdin/stdout/stderr on fds 0-2 and nothing else the launcher opened after its
  imports (a cold child of Popen inherits only 0-2: the other ranks' log files and pipe ends
  are not its to hold), and new `sys.std*` objects as `python -u` makes them;
- gets exactly the environment the launcher would have passed to Popen, and shows the rank's
  command in /proc/PID/cmdline (ps, pgrep -f);
- gets the signal dispositions a new interpreter has: every Python handler of the launcher back
  to the default, SIGINT to KeyboardInterrupt unless it was ignored, SIGPIPE and SIGXFSZ
  ignored (signals are blocked across the fork, so none reaches a launcher handler in the child);
- draws new random numbers: Python's `random` and numpy's global generator reseed themselves
  after a fork (a cold rank seeds them from the OS);
- then unwinds the launcher's stack (`BecomeRank`, caught at the launcher's `__main__`) and runs
  the rank's module as `python -m` would (`runpy`), so the interpreter ends as a cold one does:
  the exit status of SystemExit, a traceback and 1 for an error, atexit handlers, non-daemon
  threads joined, buffers flushed. A signal that kills it shows as -N in the launcher's `poll()`.

Imports happen under the environment a cold rank imports them under: the launcher's, with
`HF_HUB_OFFLINE=1` unless set and the job's `[env]` on top (what `worker.main.run` sets before
its first heavy import), so a value read at import time (huggingface_hub's offline switch,
OpenMP's thread count) is the same. What each rank sets for itself later (RANK, the master, the
network interfaces) is read when the process group starts, after the fork.

Fork-safety is checked before every fork, and a rank starts cold (Popen, as before)
when it fails: only the main thread in Python and in the process (numpy's and scipy's OpenBLAS
start worker threads at import; they stop themselves in their pthread_atfork handler, which a
probe fork after the imports runs once; torch's intra-op pool is never started by an import),
CUDA not initialized and no CUDA device file open. `CLUSTERFSDP_COLD_START=1` turns it off.

The imports run with the garbage collector off, and their objects are then frozen out of it
(`gc.freeze`, after one collection) before the first fork: the ~370,000 objects of torch,
transformers and the worker are not traversed again and again while they are made, a rank's
full collections and the one at its exit skip them (a tiny rank spent about 10 s of a loaded
2-core machine in that exit collection, cold or forked; 3 s frozen), and writing no GC headers
leaves the pages shared with the launcher. A rank that starts cold (an srun task that
forks no rank for another) imports the same way (`import_frozen`, from `worker.main.run`):
bench/README.md, "A cold rank's imports", has the CPU it saves.
Each process's hash seed is the launcher's (a cold start draws its own unless PYTHONHASHSEED).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..core import secretenv
from ..core import spec as specmod
from ..core.presets import PRESETS

ENV_COLD = "CLUSTERFSDP_COLD_START"  # "1": every rank its own interpreter (nothing preloaded)
# What every rank imports before its first step, whatever the job (its model family's module is
# added from the job file: transformers imports it on first use). `worker.rank` is the torch half
# of the entry point: it imports, at their tops, the Trainer, the model builder, the sharding, the
# checkpointer (DCP) and transformers' loading modules; only peft (LoRA runs), the tracker
# packages and lm-eval stay out, imported where a job uses them.
MODULES = (
    "torch",
    "transformers",
    "clusterfsdp.worker.main",
    "clusterfsdp.worker.rank",
)

# In a forked rank: the launcher's pid and how long its imports took (None in a cold rank).
launcher: int | None = None
preload_s: float = 0.0

FileArg = int | IO[Any] | None


class BecomeRank(BaseException):
    """Raised in a forked child once it is set up as a rank: the launcher's `__main__` catches
    it outside every frame of its own and calls `run`, so no `finally` of the launcher runs
    with its state (its tasks are the child's siblings: the caller clears them first)."""

    def __init__(self, module: str, args: Sequence[str]):
        super().__init__(module)
        self.module, self.argv = module, list(args)

    def run(self) -> None:
        """`python -m MODULE ARGS` (or `python SCRIPT.py ARGS`: `module` names a script) in this
        process: exceptions and SystemExit leave as they would."""
        if is_script(self.module):  # as a fresh interpreter runs a script: its folder first on sys.path
            sys.argv = [self.module, *self.argv]
            sys.path[0] = os.path.dirname(os.path.abspath(self.module))
            runpy.run_path(self.module, run_name="__main__")
            return
        sys.argv = [sys.argv[0], *self.argv]
        runpy.run_module(self.module, run_name="__main__", alter_sys=True)


def run_main(main: Any, *args: Any) -> Any:
    """A launcher's entry point: `main(*args)`, or the rank a forked child became."""
    rank: BecomeRank | None = None
    try:
        return main(*args)
    except BecomeRank as became:
        rank = became.with_traceback(None)  # (the launcher's frames are not kept alive)
    rank.run()
    return 0


class Forked:
    """A forked rank, as submitit's controller and the notebook's supervisor use a Popen: `pid`,
    `poll`, `wait`, `send_signal`, `kill`, `terminate`, `stdout` (a pipe's read end, if asked
    for); `returncode` -N when signal N ended it."""

    def __init__(self, pid: int, stdout: IO[bytes] | None = None):
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                return self.returncode
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """Preloads once (`preload`), then starts each rank with `start`: forked when it is safe,
    else a Popen of the same command (a cold start)."""

    def __init__(self) -> None:
        self.ready = False
        self.keep: set[int] = set()  # fds a forked rank keeps: 0-2 and what the imports opened
        self.note = "warm start: not prepared"

    def preload(self, run_dir: str | Path | None, modules: Sequence[str] = MODULES) -> str:
        """Import `modules` (torch, transformers, the worker) and the job's model family; returns
        one line for the launcher's log saying whether ranks will be forked, and why not."""
        global preload_s
        if os.environ.get(ENV_COLD) == "1":
            self.note = f"cold start: {ENV_COLD}=1"
            return self.note
        if not hasattr(os, "fork") or not Path("/proc/self/task").is_dir():
            self.note = "cold start: no fork and /proc here"
            return self.note
        t0 = time.perf_counter()
        saved = dict(os.environ)
        try:
            spec = specmod.load(Path(run_dir) / "job.toml") if run_dir else None
            os.environ.update(import_environment(spec, os.environ))
            import_frozen(spec, run_dir, modules)
        except Exception as e:  # the rank will say it again, with its traceback, when it starts cold
            self.note = f"cold start: preloading failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            return self.note
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _probe_fork()
        preload_s = time.perf_counter() - t0
        self.keep = _open_fds()
        problem = fork_problem()
        self.ready = not problem
        self.note = f"cold start: {problem}" if problem else f"warm start: imports done in {preload_s:.1f} s"
        return self.note

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stdin: FileArg = None,
        stdout: FileArg = None,
        stderr: FileArg = None,
        cwd: str | None = None,
        start_new_session: bool = False,
    ) -> Forked | subprocess.Popen[bytes]:
        """`subprocess.Popen(argv, env=env, stdin=..., stdout=..., stderr=..., cwd=...,
        start_new_session=...)` (file objects, fds, DEVNULL, PIPE for stdout, STDOUT for stderr),
        forked from here when `argv` is `python [-u] -m MODULE ...` (or a script) of this
        interpreter and forking is safe now. In another `cwd`, a forked `-m` process has it first on
        sys.path, as a new interpreter would (modules imported before the fork stay the launcher's:
        a caller that lets the folder differ checks it shadows none of them)."""
        command = module_command(argv)
        if command is None or not self.ready or fork_problem():
            return subprocess.Popen(
                list(argv), env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd,
                start_new_session=start_new_session,
            )  # fmt: skip
        return self._fork(argv, command, env, (stdin, stdout, stderr), cwd, start_new_session)

    def _fork(
        self,
        argv: Sequence[str],
        command: tuple[str, list[str]],
        env: Mapping[str, str],
        stdio: tuple[FileArg, ...],
        cwd: str | None = None,
        start_new_session: bool = False,
    ) -> Forked:
        stdin, stdout, stderr = stdio
        devnull = os.open(os.devnull, os.O_RDWR)
        read_end, write_end = os.pipe() if stdout == subprocess.PIPE else (-1, -1)
        fds = [_fd(stdin, 0, devnull), write_end if write_end >= 0 else _fd(stdout, 1, devnull)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else _fd(stderr, 2, devnull))
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
        except BaseException:
            pid = -1
            raise
        finally:
            if pid != 0:  # the launcher (or a failed fork): the child's ends are its own now
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                for fd in (devnull, write_end, *((read_end,) if pid < 0 else ())):
                    if fd >= 0:
                        os.close(fd)
        if pid == 0:
            try:
                if start_new_session:
                    os.setsid()
                if cwd is not None:
                    os.chdir(cwd)
                    sys.path[0] = os.getcwd()  # (what `python -m` puts first, in its working folder)
                _become(fds, self.keep, env, argv)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            except BaseException as e:
                os.write(2, f"warm start: setting up the rank failed: {e!r}\n".encode())
                os._exit(1)
            raise BecomeRank(*command)
        return Forked(pid, os.fdopen(read_end, "rb") if read_end >= 0 else None)


@contextmanager
def frozen_imports() -> Iterator[None]:
    """Inside: the garbage collector is off (imports make objects, none of them garbage for
    long). On leaving, also by an exception: one full collection (import-time cycles are freed,
    not kept), then every surviving object moves to the permanent generation (`gc.freeze`), and
    the collector is back as it was. Only when collections run changes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if enabled:
            gc.enable()


def import_frozen(spec: specmod.JobSpec | None, run_dir: str | Path | None, modules: Sequence[str] = MODULES) -> None:
    """Import `modules`, then the job's model family (transformers imports it on first use), and
    fill the caches every rank fills (`fill_caches`), inside `frozen_imports`: the launcher before
    its first fork, and a cold rank (`worker.main`). The family is only imported early: a model
    folder that cannot be read (gone, no config.json) or a family that does not import is left to
    the model's builder, which says so in its words."""
    with frozen_imports():
        for name in modules:
            importlib.import_module(name)
        try:
            for name in family_modules(spec, run_dir):
                importlib.import_module(name)
        except Exception:  # (the rank raises it again where it builds the model)
            pass
        fill_caches()


def fill_caches() -> None:
    """The module-level caches every rank fills before its first step, filled now if the imports
    brought their modules in (`weights.fill_caches`: transformers' checkpoint conversion table):
    in a launcher, each forked rank finds them filled (about 0.08 s of CPU each); in a cold rank,
    it only builds them earlier, with the collector off, and their objects frozen with the rest."""
    weights = sys.modules.get("clusterfsdp.worker.weights")
    if weights is not None:
        weights.fill_caches()


def import_environment(spec: specmod.JobSpec | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What `worker.main.run` adds to the environment before its first heavy import: the
    offline hub default, then the job's [env] (secrets are in the inherited environment)."""
    added = {} if "HF_HUB_OFFLINE" in environ else {"HF_HUB_OFFLINE": "1"}
    if spec is not None:
        added.update({k: v for k, v in spec.env.items() if v != secretenv.REDACTED})
    return added


def family_modules(spec: specmod.JobSpec | None, run_dir: str | Path | None) -> list[str]:
    """The modeling module of the job's model type (transformers imports it on first use)."""
    if spec is None:
        return []
    from .model import source_folder  # torch: the launcher has imported MODULES; notebook imports this module

    cfg = spec.model
    model_type = cfg.from_config.get("model_type") or PRESETS.get(cfg.preset, {}).get("model_type")
    folder = source_folder(cfg, Path(run_dir) / "model" if run_dir else None) if not model_type else None
    if folder is not None:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if not isinstance(model_type, str) or not model_type.isidentifier():
        return []
    name = f"transformers.models.{model_type}.modeling_{model_type}"
    return [name] if importlib.util.find_spec(f"transformers.models.{model_type}") is not None else []


def module_command(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, args) of `THIS_PYTHON [-u] -m MODULE ARGS...`, or (script, args) of
    `THIS_PYTHON [-u] SCRIPT.py ARGS...` (the tests' fault-injecting workers are scripts); None
    for anything else."""
    args = list(argv)
    if not args or args[0] != sys.executable:
        return None
    rest = args[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:1] and is_script(rest[0]) and os.path.isfile(rest[0]):
        return rest[0], rest[1:]
    if len(rest) < 2 or rest[0] != "-m":
        return None
    return rest[1], rest[2:]


def is_script(target: str) -> bool:
    """Whether a command's target is a script's path rather than a module's name."""
    return target.endswith(".py") and not target.startswith("-")


def fork_problem() -> str:
    """Why forking from this process now would not give a clean rank ('' when it would)."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads running"
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return f"{threads} threads in the process (a library started workers at import)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized"
    for fd in _open_fds():
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia"):
                return "a CUDA device file is open"
        except OSError:
            continue
    return ""


def _probe_fork() -> None:
    """One fork that does nothing: the pthread_atfork handlers of libraries that started worker
    threads at import (OpenBLAS) stop them now, so that `fork_problem` sees one thread."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _open_fds() -> set[int]:
    """This process's open fds (not the one that listed them, closed by then)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
            fds.add(int(name))
        except OSError:
            continue
    return fds


def _fd(value: FileArg, default: int, devnull: int) -> int:
    if value is None:
        return default
    if value == subprocess.DEVNULL:
        return devnull
    return value if isinstance(value, int) else value.fileno()


def _become(fds: list[int], keep: set[int], env: Mapping[str, str], argv: Sequence[str]) -> None:
    """The forked child made into a cold-started rank (the module docstring's list)."""
    global launcher
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in _open_fds() - keep - {0, 1, 2}:
        try:
            os.close(fd)
        except OSError:
            pass
    os.environ.clear()
    os.environ.update(env)
    _default_signals()
    _fresh_stdio()
    _show_command(argv)
    launcher = os.getppid()


def _show_command(argv: Sequence[str]) -> None:
    """/proc/self/cmdline (what ps, pgrep -f and a test that looks for a rank see) the rank's
    command instead of the launcher's: written over the launcher's argument strings, as
    setproctitle does, when it fits there (the launcher's command is the longer one here)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return
    text = b"".join(os.fsencode(a) + b"\0" for a in argv)
    if 0 < len(text) <= end - start:
        ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def _default_signals() -> None:
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)


def _fresh_stdio() -> None:
    """sys.stdin/stdout/stderr on fds 0-2 as `python -u` makes them (unbuffered writes), with
    the encoding and error handlers this interpreter chose for its own (same locale and env)."""

    def text(fd: int, like: Any, raw: Any) -> io.TextIOWrapper:
        encoding, errors = getattr(like, "encoding", None) or "utf-8", getattr(like, "errors", None) or "strict"
        return io.TextIOWrapper(raw, encoding, errors, write_through=fd > 0)

    sys.stdin = sys.__stdin__ = text(0, sys.__stdin__, io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = sys.__stdout__ = text(1, sys.__stdout__, io.FileIO(1, "w", closefd=False))
    sys.stderr = sys.__stderr__ = text(2, sys.__stderr__, io.FileIO(2, "w", closefd=False))
