"""A run's benchmark results (`<run>/benchmarks/step-N.json`, core/benchresults.py) followed
for the run screen's benchmark chart: each poll lists the folder and reads only the files that
are new or changed since the last one (a result document carries lm-eval's whole report; a
long run has one per checkpoint), so a result that lands while the screen is open is charted
on the next poll, and one rewritten (`bench --step N` again) replaces its step's row."""

from __future__ import annotations

import os
from typing import Any

from clusterfsdp.core import benchresults
from clusterfsdp.core.runfolder import RunFolder


class BenchTail:
    """The rows of one run's results; `read_new()` reads what changed."""

    def __init__(self, run: RunFolder) -> None:
        self.folder = benchresults.results_dir(run)
        self._seen: dict[str, tuple[int, int]] = {}  # file name -> (mtime_ns, size) when read
        self._rows: dict[str, dict[str, Any]] = {}  # file name -> its row (unreadable ones: none)

    def read_new(self) -> bool:
        """Read the result files that appeared or changed, forget removed ones; True if any row changed."""
        try:
            entries = [e for e in os.scandir(self.folder) if benchresults.RESULT_NAME.match(e.name)]
        except OSError:
            entries = []
        changed = False
        names = {e.name for e in entries}
        for gone in [n for n in self._seen if n not in names]:
            del self._seen[gone]
            changed = self._rows.pop(gone, None) is not None or changed
        for entry in entries:
            try:
                info = entry.stat()
            except OSError:
                continue
            stamp = (info.st_mtime_ns, info.st_size)
            if self._seen.get(entry.name) == stamp:
                continue
            self._seen[entry.name] = stamp
            doc = benchresults.read_document(self.folder / entry.name)
            old = self._rows.pop(entry.name, None)
            if doc is not None:
                self._rows[entry.name] = benchresults.row(doc)
            changed = changed or old != self._rows.get(entry.name)
        return changed

    def rows(self) -> list[dict[str, Any]]:
        """One row per evaluated step (`step`, `time`, `bench/...` scores), oldest first."""
        return sorted(self._rows.values(), key=lambda r: r["step"])
