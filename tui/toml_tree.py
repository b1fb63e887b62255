"""A folder tree that lists only what a job.toml can be picked from: folders and .toml files
(hidden ones left out), so opening a job is not a hunt through checkpoints and logs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from textual.widgets import DirectoryTree


class TomlTree(DirectoryTree):
    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [p for p in paths if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".toml")]
