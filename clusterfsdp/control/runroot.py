"""Where runs live: one rule for job files and for the commands that look runs up.

A job's runs go to `job.run_root` when the job file sets it (relative to the job file). When it
does not, and for `runs`, `status`, `logs`, `cancel`, `resume`, `export` and the TUI without
`--run-root`, the default is `$CLUSTERFSDP_RUN_ROOT`, else `run_root` in the user config file
(`$XDG_CONFIG_HOME/clusterfsdp/config.toml`, default `~/.config/clusterfsdp/config.toml`), else
`./runs` (next to the job file for a job; in the current folder for a command). Set one of the
first two on a cluster and every command finds every run from any folder.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ENV_RUN_ROOT = "CLUSTERFSDP_RUN_ROOT"


def user_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "clusterfsdp" / "config.toml"


def configured() -> str:
    """The run root set by the environment or the user config file ('' when neither sets one)."""
    value = os.environ.get(ENV_RUN_ROOT, "")
    if value:
        return value
    try:
        return str(tomllib.loads(user_config_file().read_text()).get("run_root", ""))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ""


def default_run_root(base: Path | None = None) -> Path:
    """The default run root, absolute; a relative setting (or ./runs) is taken from `base`
    (the job file's folder for a job, the current folder for commands)."""
    root = Path(configured() or "./runs").expanduser()
    return (root if root.is_absolute() else (base or Path.cwd()) / root).resolve()
