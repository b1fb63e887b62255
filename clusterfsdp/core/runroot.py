"""Where runs live: one rule for job files and for the commands that look runs up.

A job's runs go to `job.run_root` when the job file sets it (relative to the job file). When it
does not, and for `runs`, `status`, `logs`, `cancel`, `resume`, `export` and the TUI without
`--run-root`, the default is `$CLUSTERFSDP_RUN_ROOT`, else `run_root` in the user config file
(`$XDG_CONFIG_HOME/clusterfsdp/config.toml`, default `~/.config/clusterfsdp/config.toml`), else
`./runs` (next to the job file for a job; in the current folder for a command). Set one of the
first two on a cluster and every command finds every run from any folder.

A command that looks a run up without `--run-root` also looks under the run roots that job
files in the current folder set (`job.run_root` of `./*.toml`): where `submit` of those files,
from this folder, put their runs (`lookup_roots`).
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


def chosen_root(given: str | Path | None) -> Path:
    """`given` (a command's --run-root), expanded; else the default run root."""
    return Path(given).expanduser() if given else default_run_root()


JOB_FILE_BYTES = 1 << 20  # a job file is at most 1 MiB (spec/paths.py); bigger .toml files are no job files


def job_roots(folder: Path | None = None) -> list[Path]:
    """The run roots that the job files in `folder` (default: the current one) set in
    `job.run_root`, absolute (a relative one is relative to the file's folder, as for submit).
    Files that are no readable TOML, or set none, are passed over."""
    base = (folder or Path.cwd()).absolute()
    out = []
    for path in sorted(base.glob("*.toml")):
        try:
            if path.stat().st_size > JOB_FILE_BYTES:
                continue
            job = tomllib.loads(path.read_text()).get("job", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        value = job.get("run_root") if isinstance(job, dict) else None
        if isinstance(value, str) and value:
            root = Path(value).expanduser()
            out.append((root if root.is_absolute() else base / root).resolve())
    return out


def lookup_roots(folder: Path | None = None) -> list[Path]:
    """Where commands look runs up without --run-root: the default run root, then the roots the
    job files of the current folder set (job_roots), each once."""
    return list(dict.fromkeys([default_run_root(folder), *job_roots(folder)]))
