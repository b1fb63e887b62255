"""The job-file commands: `init` (a starter job.toml), `schema` (every key documented) and
`validate` (a job checked, what it will do printed). `validate` is start-up-critical: it imports
the spec, the source checks and the summary, never the run service."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..control import inputs, sweepplan
from ..control.summary import summary
from ..core import spec as specmod
from ..core.slurmping import Ping
from . import CliError


def cmd_init(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.exists() and not args.force:
        raise CliError(f"{path} exists (use --force to overwrite)")
    path.write_text(specmod.starter_toml())
    print(f"wrote {path}: edit it, then `clusterfsdp validate {path}`")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print("\n".join(specmod.describe_schema(args.key or "")))  # an unknown key: SpecError, exit 2
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    # Asks Slurm while the job is checked (start-up); --executor local asks nothing: a job checked
    # for this machine never waits on a controller that is busy, hung or restarting.
    with Ping(ask=args.executor != "local") as ping:
        job = specmod.JobText.read(args.job)
        spec = job.load(args.set or [])
        points = _table_points(job, args.set or [])
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


def _table_points(job: specmod.JobText, overrides: list[str]) -> int:
    """How many points the job file's [sweep] table has, each checked as `sweep` checks them
    (SweepError, exit 2, naming the key or the point); 0 without one. `submit` refuses a job with
    one, and `sweep` refused tables that `validate` passed."""
    table = sweepplan.read_table(job.text)
    return len(sweepplan.vary(job, overrides=overrides).points) if table.grid or table.zip else 0
