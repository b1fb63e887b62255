"""What runs one parsed command. `cli.main` loads this module by name once the command line has
parsed, so `--help` and usage errors pay none of it: the terminal guard (names and reasons read
from run folders never drive the terminal), the retry notices of a controller outage, the
one-line errors (exit 2), and the command's function, its group module imported by name when it
runs: only the command that runs pays for its group's imports (start-up, tests/test_cli.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from ..core import retrynotes, term
from ..core.errors import UserError
from . import EXIT_BAD_INPUT, names_sweep


def run(args: argparse.Namespace) -> int:
    with term.safe_output():
        return _run(args)


def command_name(args: argparse.Namespace) -> str:
    """`"<group>.<cmd_fn>"` of the function that runs `args` (set in `build_parser`): `quiet_fn`
    for `--quiet` without a run (run ids only, for shell completion: nothing of the control plane
    imported), `sweep_fn` when the reference names a sweep, else `fn`."""
    if not getattr(args, "run", None):
        return args.quiet_fn if getattr(args, "quiet", False) else args.fn
    if getattr(args, "sweep_fn", None) and names_sweep(args):
        return args.sweep_fn
    return args.fn


def command(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The function `command_name` names, its group module imported now."""
    group, name = command_name(args).split(".")
    return getattr(importlib.import_module(f"{__package__}.{group}"), name)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command in ("init", "schema", "completion") or getattr(args, "quiet", False):
            return command(args)(args)
        with retrynotes.retry_notices(retrynotes.say_on_stderr):  # a controller outage is waited for, visibly
            return command(args)(args)
    except UserError as e:  # every front-end catches this one base (core/errors.py)
        for line in e.lines:
            print(f"{term.style('error:', 'red', sys.stderr)} {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `clusterfsdp runs | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
