"""The one rule for secrets in `[env]`: a variable whose name contains KEY, TOKEN, SECRET, PASS,
CREDENTIAL, AUTH or PRIVATE (any case) is a secret. Its value travels only in the environment of
the submitting process (sbatch exports it; the local executor inherits it) and is replaced by
REDACTED in every file clusterfsdp writes: the run's job.toml, each checkpoint's copy of it,
node records, status and the TUI. A resume needs the values in its own environment again."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH|PRIVATE", re.IGNORECASE)
REDACTED = "<redacted: taken from the submitting environment>"


def is_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as it may be written to a file."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def values(env: Mapping[str, str]) -> dict[str, str]:
    """The secret entries whose values are known here (not already redacted)."""
    return {k: v for k, v in env.items() if is_secret(k) and v != REDACTED}


def missing(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Redacted secrets (a stored job.toml) whose values this process's environment lacks."""
    environ = os.environ if environ is None else environ
    return sorted(k for k, v in env.items() if v == REDACTED and k not in environ)
