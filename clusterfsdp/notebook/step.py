"""Watching one notebook launch: its output labelled by rank, the progress display, the stop
button and the result. Everything that changes the run folder goes through the run service
(`Run.srun` creates the run, checks and prepares its sources and starts the launcher through a
backend, `control.backends.SrunStep` or `LocalRanks`; `Run.cancel` stops it); this module only
shows what happens."""

from __future__ import annotations

import os
import queue
import re
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from ..control import backends
from ..control.run import GRACE_S, Run, RunError
from ..core import ckptfolder
from ..core import spec as specmod
from ..core.records import EventKind
from ..core.runfolder import RunFolder
from ..core.slurmcli import allocation_nodes
from .job import load_job, with_layout
from .launcherrors import SrunError, StepFailed, StepInterrupted
from .placement import choose_launcher, launcher_env, srun_command
from .result import SrunResult, remember
from .stepdisplay import MetricsTail, StepDisplay, in_kernel
from .tasks import MARK

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*)$")


def _backend(
    mode: str, spec: specmod.JobSpec, *, all_ranks: bool, overlap: bool, srun_args: Sequence[str]
) -> backends.SrunStep | backends.LocalRanks:
    """The backend of this launch, with the launcher command it starts for the run folder."""
    env = launcher_env(mode, spec, all_ranks=all_ranks)
    if mode == "srun":

        def srun_line(run: RunFolder) -> tuple[list[str], dict[str, str]]:
            name = backends.SrunStep.step_name(run)
            return srun_command(spec, run.path, step_name=name, overlap=overlap, srun_args=srun_args), env

        return backends.SrunStep(srun_line, allocation=os.environ.get("SLURM_JOB_ID", ""), nodes=allocation_nodes())

    def local_ranks(run: RunFolder) -> tuple[list[str], dict[str, str]]:
        world = str(spec.world_size)
        return [sys.executable, "-u", "-m", "clusterfsdp.notebook.tasks", "_local", str(run.path), world], env

    return backends.LocalRanks(local_ranks)


class _Watch:
    """One launch as the cell shows it: the launcher's output, the progress display, the stop button."""

    def __init__(
        self,
        mode: str,
        spec: specmod.JobSpec,
        run: Run,
        job_id: str,
        backend: backends.SrunStep | backends.LocalRanks,
        *,
        all_ranks: bool,
        progress: bool,
        grace_s: float,
        out: IO[str],
    ):
        assert backend.proc is not None and backend.proc.stdout is not None
        self.mode, self.spec, self.run, self.job_id, self.backend = mode, spec, run, job_id, backend
        self.folder = run.folder
        self.all_ranks, self.grace_s, self.out = all_ranks, grace_s, out
        self.proc = backend.proc
        self.world = spec.world_size
        self.step = ""  # srun: '<job>.<step>', known once a task reports or squeue lists it
        self.hosts: dict[int, str] = {}
        self.codes: dict[int, int | None] = {}
        self.tails: dict[int, deque[str]] = {}
        self.srun_lines: deque[str] = deque(maxlen=40)
        self.hinted_busy = False
        self.started = time.time()
        self.metrics = MetricsTail(self.folder.metrics_file)
        self.progress = StepDisplay(f"{spec.job.name} {run.id}", spec.train.steps, progress)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True, name="clusterfsdp-notebook-reader")
        self.reader.start()
        start = f"a job step of allocation {job_id}" if mode == "srun" else self.where
        self._print(f"[{mode}] {start}: {self.world} ranks, run folder {run.path}")

    # -- output
    def _read(self) -> None:
        assert self.proc.stdout is not None  # a pipe (backends._Streamed)
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

    def _found_step(self, step: str) -> None:
        if not self.step:
            self.step = step
            self.run.record_step(self.job_id, step)
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
    def _attempt(self):
        return self.folder.record().attempt(self.job_id)

    def _gone(self) -> bool:
        attempt = self._attempt()
        return self.proc.poll() is not None and (attempt is None or not self.backend.is_live(attempt))

    def cancel(self) -> tuple[float, str]:
        """`Run.cancel`: SIGTERM every rank (they save at the next step boundary), SIGKILL after
        grace_s, showing their output meanwhile; then wait until every rank is gone. Returns
        (seconds until all ranks were gone, how)."""
        t0 = time.time()
        self._print(f"[{self.mode}] interrupted: cancelling {self.where} (SIGTERM, SIGKILL after {self.grace_s:g} s)")
        pause = self._drain_for
        try:
            said = self.run.cancel(self.grace_s, pause=pause)
        except KeyboardInterrupt:
            self._print(f"[{self.mode}] second interrupt: killing now")
            said = self.run.cancel(0.0, pause=pause)
        except RunError as e:
            raise SrunError(f"{self.where}: {e}") from None
        how = "SIGKILL" if "killed after" in said else "SIGTERM"
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rest is bounded (about 20 s at most)
        deadline = time.time() + 15
        while not self._gone() and time.time() < deadline:
            self._drain(time.time() + 0.3)
        if not self._gone():
            fix = f"scancel {self.step}" if self.mode == "srun" else f"kill -9 -{self.proc.pid}"
            raise SrunError(
                f"{self.where}: ranks still alive {time.time() - t0:.0f} s after the interrupt; "
                f"cancel it by hand: {fix}"
            )
        self.proc.wait()
        self._drain(time.time() + 0.5)
        return time.time() - t0, how

    def _drain_for(self, seconds: float) -> None:
        self._drain(time.time() + seconds)

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
        end = next((e for e in reversed(self.folder.events(self.job_id)) if e.event.ends_attempt), None)
        ck = ckptfolder.find(self.folder.checkpoints_dir(self.spec))
        rows = self.folder.metrics()
        ok = rc == 0 and all(c == 0 for c in self.codes.values())
        if interrupted:
            status = "interrupted"
            saved = f"; saved step {end.step}: {end.checkpoint}" if end and end.event is EventKind.STOPPED else ""
            message = (
                f"interrupted: {self.where} cancelled with {how}, all {self.world} ranks "
                f"gone {gone_s:.1f} s after the interrupt{saved}"
            )
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
        more = {"interrupt_to_gone_s": round(gone_s, 2)} if interrupted else {}
        self.run.record_end(self.job_id, rc, self.codes, **more)
        result = SrunResult(
            self.folder,
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
        self.run.discard()  # nothing half-created is left behind
        if interrupted:
            result = SrunResult(
                self.folder,
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
    grace_s: float = GRACE_S,
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
    backend = _backend(mode, spec, all_ranks=all_ranks, overlap=overlap, srun_args=srun_args)
    show = in_kernel() if progress is None else progress
    stream.write(f"{notice}\n")
    for note in spec.notices():
        stream.write(f"note: {note}\n")
    stream.flush()
    sub = Run.srun(spec, backend, notice)
    for note in sub.notes:
        stream.write(f"note: {note}\n")
    watch = _Watch(
        mode, spec, sub.run, sub.job_id, backend, all_ranks=all_ranks, progress=show, grace_s=grace_s, out=stream
    )
    result = watch.watch()
    if result.status == "interrupted":
        stream.write(result.message + "\n")
        stream.flush()
        raise StepInterrupted(result.message, result)
    stream.write(result.summary() + "\n")
    stream.flush()
    if check and result.status == "failed":
        raise StepFailed(result.message, result)
    return result
