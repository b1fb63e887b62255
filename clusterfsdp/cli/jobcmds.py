"""The job file's keys: `init` (a starter job.toml) and `schema` (every key documented).
`validate` has a module of its own (validatecmd.py: its Slurm ping starts before its imports)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core import spec as specmod
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
