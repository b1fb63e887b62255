"""The sweep folder as the read-only commands see it (its layout and records: sweeplayout.py;
control.sweep makes and changes it): its points' statuses, and finding sweeps by id or prefix,
for the read-only commands (`status SWEEP`, `runs`, the notebook frame) that must not import the
run service."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ..core import benchresults, runfolder
from ..core.errors import UserError
from ..core.records import SweepPoint
from ..core.runroot import ENV_RUN_ROOT, lookup_roots
from ..core.sweeplayout import ID_PREFIX, SWEEP_FILE, SweepLayout
from ..core.value import value
from . import status
from .cost import Usage

SORT_KEYS = ("index", "state", "step", "loss", "eval_loss")
"""What the points may be sorted by besides a varied key and a benchmark score (`status SWEEP
--sort`, the TUI's s)."""


class SweepNotFound(UserError, LookupError):
    pass


@value(frozen=True)
class PointStatus:
    """One row of `status SWEEP`: the point, its varied values and its run's status."""

    point: SweepPoint
    status: status.RunStatus
    bench: benchresults.Latest | None = None  # its newest benchmark result ([benchmarks], `bench`)


@value(frozen=True)
class SweepFolder(SweepLayout):
    """A sweep folder as the read-only commands see it: its layout, and its points' statuses."""

    def statuses(self, costs: bool = False) -> tuple[list[PointStatus], str]:
        """Every point's run status (one squeue + sacct for all; with `costs` each point's cost,
        one sacct more at most) and Slurm's error, if any."""
        record = self.record()
        rows, error = status.statuses([self.run_folder(p) for p in record.points], costs)
        return [
            PointStatus(p, st, benchresults.latest(st.run)) for p, st in zip(record.points, rows, strict=True)
        ], error


def bench_names(rows: list[PointStatus], stderr: bool = True) -> list[str]:
    """The benchmark scores the points' newest results have (`bench/<task>/<metric>`), sorted;
    without `stderr`, no standard errors (what the Sweeps screen shows and sorts by)."""
    names = {n for r in rows if r.bench is not None for n in r.bench.scores}
    return sorted(n for n in names if stderr or not benchresults.is_stderr(n))


SHOWN_SCORES = 4  # benchmark score columns of `status SWEEP` and the Sweeps screen at most


def shown_scores(rows: list[PointStatus], sort: str) -> list[str]:
    """The benchmark scores shown as columns: the one sorted by first, then the others (no
    standard errors), SHOWN_SCORES at most."""
    first = [sort] if sort.startswith("bench/") else []
    return [*first, *(n for n in bench_names(rows, stderr=False) if n != sort)][:SHOWN_SCORES]


def sort_name(name: str, keys: list[str], rows: list[PointStatus]) -> str:
    """`status SWEEP --sort NAME` as a sort key: a SORT_KEYS entry, a varied key, or a benchmark
    score the points have (`bench/mytask/acc`, or `mytask/acc`); UserError in one line naming
    the known ones."""
    scores = bench_names(rows)
    if name in (*SORT_KEYS, *keys, *scores):
        return name
    if f"bench/{name}" in scores:
        return f"bench/{name}"
    known = ", ".join([*SORT_KEYS, *keys, *scores])
    unscored = " (no point has a benchmark result yet)" if not scores else ""
    raise UserError(f"--sort {name}: unknown; one of {known}{unscored}")


def sort_key(name: str, row: PointStatus) -> tuple[bool, Any]:
    """`name` (a SORT_KEYS entry, a varied key or a benchmark score) of a row, for sorting; rows
    without the value (no loss yet, no result) last, whatever the order. Benchmark scores sort
    best first: highest first, lowest first for those lm-eval says are better lower."""
    st = row.status
    if name.startswith("bench/"):
        rank = row.bench.rank(name) if row.bench is not None else None
        return (rank is None, rank if rank is not None else 0)
    value = {"index": row.point.index, "state": str(st.state), "step": st.step, "loss": st.loss,
             "eval_loss": st.eval_loss}.get(name, row.point.values.get(name))  # fmt: skip
    return (value is None, value if value is not None else 0)


@value(frozen=True)
class SweepSummary:
    """One sweep in a line (`runs`, the TUI's sweep list): its points' states counted and the best
    loss (a point's eval loss where it has one, else its training loss)."""

    states: list[tuple[str, int]]  # most common first
    best: float | None
    best_point: SweepPoint | None = None  # the point that has it
    best_key: str = "loss"  # eval_loss or loss: what `best` is

    @classmethod
    def of(cls, rows: list[PointStatus]) -> SweepSummary:
        states = Counter(str(r.status.state) for r in rows)
        scored = [(score, r) for r in rows if (score := _score(r)) is not None]
        if not scored:
            return cls(states.most_common(), None)
        (best, key), row = min(scored, key=lambda pair: pair[0][0])
        return cls(states.most_common(), best, row.point, key)

    @property
    def counts(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in self.states)


def _score(row: PointStatus) -> tuple[float, str] | None:
    """A point's eval loss where it has one, else its training loss, and which it is."""
    if row.status.eval_loss is not None:
        return row.status.eval_loss, "eval_loss"
    return (row.status.loss, "loss") if row.status.loss is not None else None


def total_cost(rows: list[PointStatus]) -> tuple[Usage, int]:
    """The points' cost together, and how many points that ran on Slurm sacct could not tell."""
    used = sum((r.status.cost.total for r in rows if r.status.cost is not None), Usage())
    return used, sum(r.status.cost is None and r.status.on_slurm for r in rows)


def is_sweep_ref(ref: str) -> bool:
    """`ref` names a sweep (its id or a prefix of one, or its folder), not a run."""
    return ref.startswith(ID_PREFIX) or (Path(ref).expanduser() / SWEEP_FILE).is_file()


def all_sweeps(run_root: str | Path | None = None) -> list[SweepFolder]:
    """Sweeps under the run root (default: runroot.lookup_roots(), as for runs), newest first."""
    roots = [Path(run_root).expanduser()] if run_root is not None else lookup_roots()
    found = {SweepFolder(p.parent.resolve()) for root in roots if root.is_dir() for p in root.glob(f"*/{SWEEP_FILE}")}
    return sorted(found, key=lambda s: s.id, reverse=True)


def find_sweep(ref: str, run_root: str | Path | None = None) -> SweepFolder:
    """A sweep from its folder, its id or a unique prefix of its id."""
    if (Path(ref).expanduser() / SWEEP_FILE).is_file():
        return SweepFolder(Path(ref).expanduser().resolve())
    every = all_sweeps(run_root)
    found = [s for s in every if s.id == ref] or [s for s in every if s.id.startswith(ref)]
    if len(found) == 1:
        return found[0]
    roots = [Path(run_root).expanduser()] if run_root is not None else lookup_roots()
    if not found:
        hint = f"give the sweep folder, --run-root, or set ${ENV_RUN_ROOT}"
        raise SweepNotFound(f"no sweep {ref!r} under {' or '.join(map(str, roots))} ({hint})")
    raise SweepNotFound(f"{ref!r} matches {len(found)} sweeps: {', '.join(s.id for s in found[:5])}")


def sweep_of(run: runfolder.RunFolder) -> SweepFolder | None:
    """The sweep a run is a point of, if any."""
    return SweepFolder(run.path.parent) if (run.path.parent / SWEEP_FILE).is_file() else None
