"""Paths as the screens show them: relative to the current directory when under it (short,
like git prints them), absolute otherwise, so they can be pasted into a shell either way."""

from __future__ import annotations

from pathlib import Path


def shown(path: Path) -> str:
    path = Path(path).expanduser().absolute()
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)
