"""Running and watching one notebook launch: the launcher process in its own session, its output
labelled by rank, the attempt recorded in the run folder, the stop button, and the result."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from ..control import ckptfolder, procs, runfolder, slurmcli
from ..control import spec as specmod
from ..control.records import EventKind, Executor
from .errors import SrunError, StepFailed, StepInterrupted
from .job import load_job, with_layout
from .placement import allocation_nodes, choose_launcher, launcher_env, srun_command
from .progress import MetricsTail, Progress, in_kernel
from .result import SrunResult, remember
from .tasks import MARK

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*)$")


def _pdeathsig_shim(cmd: list[str]) -> list[str]:
    """Run `cmd` so that it gets SIGTERM if this (the kernel's main) thread dies: a kernel restart
    then cancels the step instead of leaving it running. Only from the main thread (the death
    signal follows the thread that forked)."""
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return cmd
    shim = (
        "import ctypes,os,signal,sys\n"
        "try:\n    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))\nexcept Exception:\n    pass\n"
        "if os.getppid() != int(sys.argv[1]):\n    sys.exit(143)\n"
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-c", shim, str(os.getpid()), *cmd]


def _squeue_steps(allocation: str) -> dict[str, str]:
    """{step id 'J.S': step name} of the allocation's live steps."""
    try:
        out = slurmcli.run(["squeue", "--steps", "-h", "-j", allocation, "-o", "%i|%j"], timeout=15)
    except slurmcli.SlurmError:
        return {}
    rows = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition("|")
        if step:
            rows[step] = name
    return rows


class _Launch:
    """One launch: the launcher process, its output stream, the progress display, cancel."""

    def __init__(
        self,
        mode: str,
        spec: specmod.JobSpec,
        run: runfolder.RunFolder,
        *,
        all_ranks: bool,
        overlap: bool,
        srun_args: Sequence[str],
        progress: bool,
        grace_s: float,
        out: IO[str],
    ):
        self.mode, self.spec, self.run, self.all_ranks, self.grace_s, self.out = (
            mode,
            spec,
            run,
            all_ranks,
            grace_s,
            out,
        )
        self.world = spec.world_size
        self.allocation = os.environ.get("SLURM_JOB_ID", "")
        self.step_name = f"clusterfsdp-nb-{run.id}"
        self.job_id = self.allocation if mode == "srun" else ""  # the run folder's attempt key
        self.step = ""  # srun: '<job>.<step>', known once a task reports or squeue lists it
        self.hosts: dict[int, str] = {}
        self.codes: dict[int, int | None] = {}
        self.tails: dict[int, deque[str]] = {}
        self.srun_lines: deque[str] = deque(maxlen=40)
        self.hinted_busy = False
        self.started = time.time()
        self.metrics = MetricsTail(run.metrics_file)
        self.progress = Progress(f"{spec.job.name} {run.id}", spec.train.steps, progress)
        if mode == "srun":
            cmd = srun_command(spec, run.path, step_name=self.step_name, overlap=overlap, srun_args=srun_args)
        else:
            cmd = [sys.executable, "-u", "-m", "clusterfsdp.notebook.tasks", "_local", str(run.path), str(self.world)]
        env = launcher_env(mode, spec, all_ranks=all_ranks)
        try:
            self.proc = subprocess.Popen(
                _pdeathsig_shim(cmd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise SrunError(f"could not start {cmd[0]}: {e}") from None
        self.pgid = self.proc.pid  # its own session: the session leader's pid is the group id
        self.leader = procs.ProcessId.of(self.pgid)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True, name="clusterfsdp-notebook-reader")
        self.reader.start()
        if mode == "local":
            self.job_id = f"nb{self.proc.pid}"  # the supervisor's CLUSTERFSDP_JOB_ID (the shim keeps the pid)
        self._record_attempt()

    # -- output
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        self.lines.put(None)

    def _print(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _handle(self, line: str) -> None:
        m = _LABEL.match(line)
        if not m:  # srun's own messages (or the local supervisor's): always shown
            if not line.strip():
                return
            self.srun_lines.append(line)
            em = _SRUN_TASK_ERROR.search(line)
            if em:
                self._srun_task_error(em.group(2), em.group(3))
            self._print(f"[{self.mode}] {line}")
            if "Requested nodes are busy" in line and not self.hinted_busy:
                self.hinted_busy = True
                self._print(
                    f"[{self.mode}] (another job step holds the allocation's resources: wait for it, cancel "
                    "it, or pass overlap=True to share them)"
                )
            return
        rank, text = int(m.group(1)), m.group(2)
        if text.startswith(MARK):
            self._marker(rank, text[len(MARK) :])
            return
        self.tails.setdefault(rank, deque(maxlen=30)).append(text)
        if rank == 0 or self.all_ranks:
            text = re.sub(rf"^\[rank{rank}\] ", "", text)
            self._print(f"[rank{rank} {self.hosts.get(rank, '?')}] {text}")

    def _marker(self, rank: int, text: str) -> None:
        fields = dict(item.split("=", 1) for item in text.split()[1:] if "=" in item)
        kind = text.split(" ", 1)[0]
        if kind == "task":
            self.hosts[rank] = fields.get("host", "?")
            if self.mode == "srun" and fields.get("step", "-") != "-":
                self._found_step(fields["step"])
        elif kind == "exit":
            code = fields.get("code", "")
            self.codes[rank] = int(code) if re.fullmatch(r"-?\d+", code) else None

    def _srun_task_error(self, tasks: str, what: str) -> None:
        m = re.search(r"exit code (\d+)", what)
        code = int(m.group(1)) if m else -9 if "Killed" in what else -15 if "Terminated" in what else None
        for part in tasks.split(","):
            lo, _, hi = part.partition("-")
            for r in range(int(lo), int(hi or lo) + 1):
                self.codes.setdefault(r, code)

    @property
    def where(self) -> str:
        """What to cancel, in words: the srun step (or the allocation while it waits), or the local job."""
        if self.mode == "local":
            return f"local job {self.job_id}"
        return f"srun step {self.step}" if self.step else f"srun (no job step yet) in allocation {self.job_id}"

    def _record_attempt(self) -> None:
        """The attempt goes into state.json at once, with the launcher's process group, so
        `clusterfsdp status` shows the run PENDING/RUNNING while it lives."""
        extra: dict[str, Any] = {"leader": self.leader}
        if self.mode == "srun":
            extra.update(allocation=self.allocation, step_name=self.step_name)
        self.run.add_attempt(
            self.job_id,
            Executor(self.mode),
            "notebook srun" if self.mode == "srun" else "notebook (local processes)",
            world_size=self.world,
            **extra,
        )
        start = f"a job step of allocation {self.job_id}" if self.mode == "srun" else self.where
        self._print(f"[{self.mode}] {start}: {self.world} ranks, run folder {self.run.path}")

    def _found_step(self, step: str) -> None:
        if not self.step:
            self.step = step
            self.run.update_attempt(self.job_id, step=step)
            self._print(f"[srun] job step {step} started")

    def _refresh(self) -> None:
        rows = self.metrics.new_rows()
        state = "running" if self.hosts else None
        if rows or state:
            self.progress.update(rows[-1] if rows else None, state)

    def _drain(self, until: float) -> bool:
        """Handle output until the launcher exited and its output ended, or `until`; True if it ended."""
        last_refresh = 0.0
        while True:
            now = time.time()
            if now - last_refresh >= 1.0:
                self._refresh()
                last_refresh = now
            timeout = min(0.25, max(0.0, until - now))
            try:
                line = self.lines.get(timeout=timeout) if timeout > 0 else self.lines.get_nowait()
            except queue.Empty:
                line = ""
                if self.proc.poll() is not None and not self.reader.is_alive():
                    return True
                if time.time() >= until:
                    return self.proc.poll() is not None and not self.reader.is_alive()
                if self.proc.poll() is not None and time.time() - self._exited_at() > 2.0:
                    return True  # a grandchild holds the pipe open; the launcher itself is done
                continue
            if line is None:
                self.proc.wait()
                return True
            self._handle(line)

    _exit_seen: float | None = None

    def _exited_at(self) -> float:
        if self._exit_seen is None:
            self._exit_seen = time.time()
        return self._exit_seen

    # -- cancel
    def _lookup_step(self) -> str:
        """The step id, from squeue when no task has reported yet (srun may be waiting for resources)."""
        if not self.step:
            for step, name in _squeue_steps(self.allocation).items():
                if name == self.step_name:
                    self._found_step(step)
        return self.step

    def _signal(self, sig: signal.Signals) -> None:
        if self.mode == "srun":
            step = self._lookup_step()
            if step:
                try:
                    slurmcli.run(["scancel", f"--signal={sig.name.removeprefix('SIG')}", step], timeout=15)
                    return
                except slurmcli.SlurmError:
                    pass
            try:  # no step yet (srun still waiting for resources): stop srun itself
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
        else:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass

    def _gone(self) -> bool:
        if self.mode == "srun":
            if self.proc.poll() is None:
                return False
            return not self.step or self.step not in _squeue_steps(self.allocation)
        return not procs.group_alive(self.leader)

    def cancel(self) -> tuple[float, str]:
        """SIGTERM every rank (they save at the next step boundary), SIGKILL after grace_s;
        returns (seconds until all ranks were gone, how)."""
        t0 = time.time()
        how = "SIGTERM"
        self._print(f"[{self.mode}] interrupted: cancelling {self.where} (SIGTERM, SIGKILL after {self.grace_s:g} s)")
        try:
            self._signal(signal.SIGTERM)
            self._drain(time.time() + self.grace_s)
        except KeyboardInterrupt:
            self._print(f"[{self.mode}] second interrupt: killing now")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rest is bounded (about 20 s at most)
        if not self._gone():
            how = "SIGKILL"
            self._signal(signal.SIGKILL)
            if self.mode == "srun" and self.step:
                try:
                    slurmcli.run(["scancel", self.step], timeout=15)
                except slurmcli.SlurmError:
                    pass
            self._drain(time.time() + 5)
            if self.proc.poll() is None:
                os.killpg(self.pgid, signal.SIGKILL)
        deadline = time.time() + 15
        while not self._gone() and time.time() < deadline:
            self._drain(time.time() + 0.3)
        if not self._gone():
            fix = f"scancel {self.step}" if self.mode == "srun" else f"kill -9 -{self.pgid}"
            raise SrunError(
                f"{self.where}: ranks still alive {time.time() - t0:.0f} s after the interrupt; "
                f"cancel it by hand: {fix}"
            )
        self.proc.wait()
        self._drain(time.time() + 0.5)
        return time.time() - t0, how

    # -- the whole launch
    def watch(self) -> SrunResult:
        interrupted, gone_s, how = False, 0.0, ""
        try:
            self._drain(float("inf"))
            self.proc.wait()
        except KeyboardInterrupt:
            interrupted = True
            main = threading.current_thread() is threading.main_thread()
            previous = signal.getsignal(signal.SIGINT) if main else None
            if main:  # a second stop press during the grace period escalates to SIGKILL
                signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                gone_s, how = self.cancel()
            finally:
                if main:
                    signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        rc = self.proc.returncode
        result = self._result(rc, interrupted, gone_s, how)
        remember(result)
        self.progress.update(result.final_metrics or None, result.status)
        return result

    def _result(self, rc: int | None, interrupted: bool, gone_s: float, how: str) -> SrunResult:
        if self.mode == "srun" and not self.step:  # never became a step (srun refused, or was stopped while waiting)
            return self._never_started(rc, interrupted, gone_s)
        for r in range(self.world):
            if r not in self.codes:
                self.codes[r] = 0 if rc == 0 and not interrupted else None
        end = next((e for e in reversed(self.run.events(self.job_id)) if e.event.ends_attempt), None)
        ck = ckptfolder.find(self.run.checkpoints_dir(self.spec))
        rows = self.run.metrics()
        ok = rc == 0 and all(c == 0 for c in self.codes.values())
        if interrupted:
            status = "interrupted"
            saved = f"; saved step {end.step}: {end.checkpoint}" if end and end.event is EventKind.STOPPED else ""
            message = (
                f"interrupted: {self.where} cancelled with {how}, all {self.world} ranks "
                f"gone {gone_s:.1f} s after the interrupt{saved}"
            )
            self.run.update_attempt(self.job_id, cancelled=time.time(), interrupt_to_gone_s=round(gone_s, 2))
        elif ok and (end is None or end.event is EventKind.COMPLETED):
            status, message = "completed", ""
        elif ok and end is not None and end.event is EventKind.STOPPED:
            status, message = "stopped", f"stopped from outside: {end.reason}"
        else:
            status = "failed"
            bad = sorted(r for r, c in self.codes.items() if c != 0)
            reason = end.reason if end else ""
            message = f"failed: {self.mode} exit status {rc}; ranks {bad or '?'} exited non-zero" + (
                f"; {reason}" if reason else ""
            )
        self.run.update_attempt(
            self.job_id, ended=time.time(), returncode=rc, exit_codes={str(r): c for r, c in sorted(self.codes.items())}
        )
        result = SrunResult(
            self.run,
            self.mode,
            self.job_id,
            self.step,
            status,
            rc,
            dict(sorted(self.codes.items())),
            dict(self.hosts),
            rows,
            ck.path if ck else None,
            time.time() - self.started,
            message,
        )
        if status == "failed":
            self._show_failure()
        return result

    def _show_failure(self) -> None:
        for r in sorted(r for r, c in self.codes.items() if c != 0):
            lines = list(self.tails.get(r, ()))
            if r == 0 or self.all_ranks or not lines:
                continue  # already shown live (or nothing to show)
            self._print(f"--- last output of rank {r} on {self.hosts.get(r, '?')} ---")
            for line in lines[-15:]:
                self._print(f"[rank{r} {self.hosts.get(r, '?')}] {line}")

    def _never_started(self, rc: int | None, interrupted: bool, gone_s: float) -> SrunResult:
        shutil.rmtree(self.run.path, ignore_errors=True)  # nothing half-created is left behind
        if interrupted:
            result = SrunResult(
                self.run,
                self.mode,
                self.job_id,
                "",
                "interrupted",
                rc,
                {},
                {},
                [],
                None,
                time.time() - self.started,
                f"interrupted before the step started "
                f"({gone_s:.1f} s to stop {self.mode}); nothing ran, run folder removed",
            )
            return result
        detail = " | ".join(self.srun_lines) or f"exit status {rc}"
        raise SrunError(f"{self.mode} did not start the job (exit status {rc}): {detail}")


def srun(
    job: str | os.PathLike[str] | specmod.JobSpec,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    tasks_per_node: int | None = None,
    overrides: Mapping[str, Any] | Iterable[str] | str | None = None,
    all_ranks: bool = False,
    overlap: bool = False,
    launcher: str = "auto",
    srun_args: Sequence[str] = (),
    progress: bool | None = None,
    grace_s: float = 3.0,
    check: bool = False,
    out: IO[str] | None = None,
) -> SrunResult:
    """Train `job` (a job.toml path, TOML text or a JobSpec) as a job step of the allocation this
    kernel runs in, or as local processes where there is no Slurm at all (see the module doc).

    nodes / gpus_per_node / tasks_per_node: the step's layout (default: the job's [slurm] values);
        one task per GPU. overrides: 'section.key=value' strings or {'section.key': value}.
    all_ranks: stream every rank's output (default: rank 0 only), each line prefixed `[rank<R> <host>]`.
    overlap: `srun --overlap` (share the allocation's resources with steps already running).
    launcher: 'auto', 'srun' (an error outside an allocation) or 'local'.
    srun_args: extra srun options, e.g. ['--nodelist=node2'].
    progress: the in-place progress display (default: on inside a Jupyter kernel).
    grace_s: after the stop button, seconds the ranks get to save at a step boundary before SIGKILL.
    check: raise StepFailed instead of returning a failed result.

    Returns an SrunResult; the stop button cancels the step and raises StepInterrupted (its
    `.result`, and `last_result()`, hold what was done).
    """
    stream: IO[str] = out or sys.stdout
    spec = with_layout(load_job(job, overrides), nodes, gpus_per_node, tasks_per_node)
    mode, notice = choose_launcher(launcher)
    if mode == "srun":
        have = allocation_nodes()
        if have is not None and spec.slurm.nodes > have:
            raise SrunError(
                f"the step needs {spec.slurm.nodes} nodes but allocation {os.environ['SLURM_JOB_ID']} "
                f"has {have}: pass nodes={have} (or salloc more nodes)"
            )
    elif spec.slurm.nodes > 1:
        raise SrunError(
            f"slurm.nodes = {spec.slurm.nodes}: without Slurm the job runs as local processes on this "
            "machine; pass nodes=1 (or run the kernel inside `salloc -N{n}`)".replace("{n}", str(spec.slurm.nodes))
        )
    show = in_kernel() if progress is None else progress
    run = runfolder.create_run(spec, Executor(mode))
    stream.write(f"{notice}\n")
    for note in spec.notices():
        stream.write(f"note: {note}\n")
    stream.flush()
    try:
        launch = _Launch(
            mode,
            spec,
            run,
            all_ranks=all_ranks,
            overlap=overlap,
            srun_args=srun_args,
            progress=show,
            grace_s=grace_s,
            out=stream,
        )
    except BaseException:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    result = launch.watch()
    if result.status == "interrupted":
        stream.write(result.message + "\n")
        stream.flush()
        raise StepInterrupted(result.message, result)
    stream.write(result.summary() + "\n")
    stream.flush()
    if check and result.status == "failed":
        raise StepFailed(result.message, result)
    return result
