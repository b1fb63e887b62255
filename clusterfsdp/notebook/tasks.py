"""The processes of a notebook launch: one rank (`_task`, under srun or the local supervisor) and the
local supervisor that stands in for srun (`_local`). `python -m clusterfsdp.notebook.tasks`.

The local supervisor imports torch and transformers once and forks its ranks
(`worker.warmstart`), a fresh process started for the launch, never the kernel (itself forked by
a warm launcher of `CLUSTERFSDP_LAUNCHER` when one is named and may: control/backends.py; it then
stops its ranks when its stdin, a pipe from the kernel, reaches end-of-file); srun's tasks start
as they did."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback

from ..worker import main as worker
from ..worker import warmstart
from ..worker.distenv import free_master_port

MARK = "@@clusterfsdp "  # marker lines the tasks print on stdout (never shown in the cell)


def _mark(text: str) -> None:
    stream = sys.__stdout__ or sys.stdout  # the real stdout, not the worker's log Tee
    stream.write(MARK + text + "\n")
    stream.flush()


def _task_main(run_dir: str) -> int:
    """One rank: report its host and step (the kernel prefixes its lines with the host and cancels
    the step by its id), run the worker, report the exit status (srun reports only failures)."""
    env = os.environ
    rank = env.get("SLURM_PROCID") or env.get("RANK") or "0"
    step = (
        f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}" if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID") else "-"
    )
    _mark(f"task rank={rank} host={socket.gethostname()} pid={os.getpid()} step={step}")

    code = 0
    try:
        worker.run(run_dir)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        if not isinstance(sys.stderr, worker.Tee):  # the worker prints its own tracebacks once it logs
            traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    _mark(f"exit rank={rank} code={code}")
    if code != 0:
        # Leave without the interpreter's teardown: a failed rank's process group is still up, and
        # its gloo threads, finding a peer gone (stopped by kill-on-bad-exit), can abort the process
        # while Python unwinds (SIGABRT, -6, instead of the status just reported). Everything the
        # rank had to say is flushed above; the worker recorded the failure before raising.
        os._exit(code)
    return code


def _until_owner_gone(gone) -> None:
    """Read stdin to its end, then call `gone`: a supervisor a warm launcher forked is not the
    kernel's child, so the parent-death signal cannot stop it; its stdin is a pipe whose other end
    only the kernel holds, which reaches end-of-file when the kernel is gone (killed, restarted)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    gone()


def _local_main(run_dir: str, ntasks: int) -> int:
    """Local stand-in for srun: ntasks ranks with torchrun-style env in this process group,
    output labelled 'R: ' like `srun --label`, kill-on-bad-exit, exit status = the worst rank's."""
    stopping = threading.Event()

    def on_term(signum, frame):  # also reaches the ranks through the process group; forward if it did not
        stopping.set()
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass

    procs: list[warmstart.Forked | subprocess.Popen[bytes]] = []
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job_id = f"nb{os.getpid()}"

    port = free_master_port()
    out = sys.stdout.buffer
    lock = threading.Lock()
    host = socket.gethostname()

    def pump(rank: int, stream) -> None:
        for raw in iter(stream.readline, b""):
            with lock:
                out.write(f"{rank}: ".encode() + (raw if raw.endswith(b"\n") else raw + b"\n"))
                out.flush()

    launcher = warmstart.Launcher()  # torch and transformers imported once, each rank forked
    launcher.preload(run_dir)
    for rank in range(ntasks):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(ntasks),
            LOCAL_WORLD_SIZE=str(ntasks),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CLUSTERFSDP_JOB_ID=job_id,
        )
        if stopping.is_set():
            break
        argv = [sys.executable, "-u", "-m", "clusterfsdp.notebook.tasks", "_task", run_dir]
        procs.append(
            launcher.start(argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    threads = []  # started once every rank is: a thread alive at a fork would make it unsafe
    for rank, p in enumerate(procs):
        t = threading.Thread(target=pump, args=(rank, p.stdout), daemon=True)
        t.start()
        threads.append(t)
    if stat.S_ISFIFO(os.fstat(0).st_mode):  # forked by a warm launcher for the kernel (control/backends._served)
        threading.Thread(target=_until_owner_gone, args=(lambda: on_term(signal.SIGTERM, None),), daemon=True).start()
    codes: dict[int, int] = {}
    kill_at = None
    while len(codes) < len(procs):
        for rank, p in enumerate(procs):
            code = p.poll() if rank not in codes else None
            if code is not None:
                codes[rank] = code
                if code != 0 and kill_at is None:  # like srun --kill-on-bad-exit
                    with lock:
                        out.write(f"local: rank {rank} exited with status {code}: stopping the others\n".encode())
                        out.flush()
                    for q in procs:
                        if q.poll() is None:
                            q.send_signal(signal.SIGTERM)
                    kill_at = time.time() + 2.0
        if kill_at is not None and time.time() > kill_at:
            for q in procs:
                if q.poll() is None:
                    q.kill()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=2)
    with lock:
        for rank, code in sorted(codes.items()):
            out.write(f"{rank}: {MARK}exit rank={rank} code={code} host={host}\n".encode())
        out.flush()
    worst = max((128 - c if c < 0 else c for c in codes.values()), default=0)
    return worst


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "_task":
        return _task_main(argv[1])
    if len(argv) == 3 and argv[0] == "_local":
        return _local_main(argv[1], int(argv[2]))
    print(
        "usage: python -m clusterfsdp.notebook.tasks _task RUN_DIR | _local RUN_DIR NTASKS\n"
        "(internal entry points of clusterfsdp.notebook.srun)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(warmstart.run_main(main))  # (a rank forked by `_local` leaves `main` as BecomeRank)
