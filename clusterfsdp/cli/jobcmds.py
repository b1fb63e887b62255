"""The job-file commands: `init` (a starter job.toml), `schema` (every key documented) and
`validate` (a job checked, what it will do printed). `validate` is start-up-critical: it imports
the spec, the source checks and the summary, never the run service."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CliError


def cmd_init(args: argparse.Namespace) -> int:
    from ..core import spec as specmod

    path = Path(args.path)
    if path.exists() and not args.force:
        raise CliError(f"{path} exists (use --force to overwrite)")
    path.write_text(specmod.starter_toml())
    print(f"wrote {path}: edit it, then `clusterfsdp validate {path}`")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from ..core import spec as specmod

    print("\n".join(specmod.describe_schema(args.key or "")))  # an unknown key: SpecError, exit 2
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ..core.slurmping import Ping

    # Asks Slurm while the job is checked (start-up); --executor local asks nothing: a job checked
    # for this machine never waits on a controller that is busy, hung or restarting.
    with Ping(ask=args.executor != "local") as ping:
        from ..control import inputs
        from ..control.summary import summary
        from ..core import spec as specmod

        job = specmod.JobText.read(args.job)
        spec = job.load(args.set or [])
        points = 0
        if "sweep" in job.text:  # sweepcmds only for a job file that may have a [sweep] table (start-up)
            from . import sweepcmds

            points = sweepcmds.table_points(job, args.set or [])
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
