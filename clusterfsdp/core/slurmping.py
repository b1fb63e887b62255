"""Is there a Slurm controller, and does it answer? One `scontrol ping`, started early and read
late, so that a caller overlaps it with its own work (`validate` checks the job meanwhile).

Apart from `slurmcli` (whose job table, retries and records `validate` does not need): start-up
is paid on every call (issue 25 item 3)."""

from __future__ import annotations

import os
import shutil
import subprocess


def controller() -> str:
    """'up', 'down' (Slurm is configured here and names a controller that does not answer: a
    restart or an outage, worth waiting for) or 'none' (no Slurm on this machine)."""
    with Ping() as ping:
        return ping.state()


class Ping:
    """`scontrol ping` started on entry, its answer (`controller`'s) read by `state()`: a caller
    overlaps the ping (milliseconds of a subprocess) with its own work, as `validate` does with its
    checks (start-up, issue 25 item 3). On exit a ping still running is killed and reaped.

    No ping where $SLURM_CONF names a missing file: scontrol would retry reading it for 60 s and
    the answer after our 30 s would be 'none' anyway (every `submit`, `validate` and notebook
    `srun()` on such a machine waited those 30 s in silence)."""

    def __init__(self, ask: bool = True) -> None:
        self.ask = ask  # False: no ping at all, the answer is 'none' (a caller that pinned the local executor)

    def __enter__(self) -> Ping:
        self.proc: subprocess.Popen[str] | None = None
        conf = os.environ.get("SLURM_CONF")
        if not self.ask or (conf and not os.path.exists(conf)):
            return self
        if shutil.which("sbatch") is not None and shutil.which("scontrol") is not None:
            self.proc = subprocess.Popen(
                ["scontrol", "ping"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        return self

    def state(self) -> str:
        if self.proc is None:
            return "none"
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            return "none"
        if "is UP" in out:
            return "up"
        return "down" if "is DOWN" in out else "none"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.communicate()
