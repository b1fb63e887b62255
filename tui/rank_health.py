"""The run screen's per-rank health table: each rank's phase, step, step time, how late it
reaches the others, the age of its last heartbeat, and a mark for hung ranks and stragglers
(core/health.py reads the heartbeat files and the events; this only shows them).

Hidden when the run has no heartbeats, or when every rank of its newest attempt left training
with nothing to mark. Marked ranks come first, so a hung rank among hundreds is on screen.
"""

from __future__ import annotations

from textual.widgets import DataTable

from clusterfsdp.core.health import Phase, RankHealth

COLUMNS = (
    ("rank", "RANK"),
    ("host", "HOST"),
    ("phase", "PHASE"),
    ("step", "STEP"),
    ("step_s", "STEP TIME"),
    ("late", "LATE"),
    ("beat", "HEARTBEAT"),
    ("mark", "HEALTH"),
)
_ORDER = {"HUNG": 0, "straggler": 1, "stale": 2, "ok": 3}


def row_cells(r: RankHealth) -> tuple[str, ...]:
    """One rank's cells, in COLUMNS' order."""
    return (
        str(r.rank),
        r.host,
        str(r.phase),
        str(r.step),
        f"{r.step_s:.3f} s" if r.step_s else "-",
        f"{r.lag_s:.3f} s" if r.lag_s else "-",
        "-" if r.phase is Phase.DONE else f"{r.beat_age_s:.0f} s ago",
        r.mark,
    )


def summary(rows: list[RankHealth]) -> str:
    """The table's title: 'ranks: 7 ok, 1 straggler'."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.mark] = counts.get(r.mark, 0) + 1
    return "ranks: " + ", ".join(f"{n} {mark}" for mark, n in sorted(counts.items(), key=lambda kv: _ORDER[kv[0]]))


class RankHealthTable(DataTable):
    """Per-rank health of the newest attempt (`show` with control.health.rank_health's rows)."""

    DEFAULT_CSS = """
    RankHealthTable {
        height: auto;
        max-height: 8;
        border: round $panel-lighten-2;
        display: none;
    }
    RankHealthTable.-shown {
        display: block;
    }
    """

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, rows: list[RankHealth]) -> None:
        marked = any(r.mark != "ok" for r in rows)
        self.set_class(bool(rows) and (marked or any(r.phase is not Phase.DONE for r in rows)), "-shown")
        self.clear()
        for r in sorted(rows, key=lambda r: (_ORDER[r.mark], r.rank)):
            self.add_row(*row_cells(r), key=str(r.rank))
        self.border_title = summary(rows) if rows else ""
