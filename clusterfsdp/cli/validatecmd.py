"""`clusterfsdp validate`: a job checked, what it will do printed. Start-up-critical: it asks Slurm
(`scontrol ping`, in a subprocess) first and imports the spec, the source checks and the summary
while the controller answers, never the run service; a module of its own so that nothing is
imported before the ping has started (tests/test_cli.py counts its modules)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..core.slurmping import Ping

if TYPE_CHECKING:
    from ..core.spec import JobText


def cmd_validate(args: argparse.Namespace) -> int:
    # Asks Slurm while the job is checked (start-up); --executor local asks nothing: a job checked
    # for this machine never waits on a controller that is busy, hung or restarting.
    with Ping(ask=args.executor != "local") as ping:
        # imported while `scontrol ping` runs, not at module level: the ping overlaps this import work
        from ..control import inputs
        from ..control.summary import summary
        from ..core import spec as specmod

        job = specmod.JobText.read(args.job)
        spec = job.load(args.set or [])
        points = _table_points(job, args.set or []) if "sweep" in job.text else 0
        prepared = inputs.prepare_sources(spec, mode="check")  # hub ids: asks the hub, downloads nothing
        spec = prepared.spec
        inside = inputs.container_only_paths(spec)
        later = "checked inside the container when the job starts"
        prepared.notes += [f"data path {path} is not on this host: {later}" for path in inside]
        reachable = ping.state() == "up"
    if args.executor == "local":
        where = "this machine (local executor)"
    else:
        where = "Slurm (controller answers)" if reachable else "this machine (local executor; no reachable Slurm)"
    if not reachable and (needs := spec.needs_slurm()):
        where += f" -- but {needs}"
    print(summary(spec, where))
    if points:
        print(f"sweep      {points} point(s) in [sweep], each checked: `clusterfsdp sweep {args.job}` runs them")
    for note in prepared.notes:
        print(f"note       {note}")
    for line in [] if inside else inputs.prepared_state(spec):
        print(f"prepared   {line}")
    print("ok")
    return 0


def _table_points(job: JobText, overrides: list[str]) -> int:
    """How many points the job file's [sweep] table has, each checked as `sweep` checks them
    (SweepError, exit 2, naming the key or the point); 0 without one. `submit` refuses a job with
    one, and `sweep` refused tables that `validate` passed."""
    from ..control import sweepplan  # a job file that may have a [sweep] table only (start-up of validate)

    table = sweepplan.read_table(job.text)
    return len(sweepplan.vary(job, overrides=overrides).points) if table.grid or table.zip else 0
