"""What a sweep varies, and its points: `--grid KEY=V1,V2`, `--zip KEY=V1,V2` and the job file's
[sweep] table, each value typed by the schema exactly as `--set` types it (`spec.apply_overrides`
then `spec.coerce`), expanded into points (the cross product of the grid's lists, times the
zipped lists taken together), and each point's overrides; `vary` checks every point's job spec.
Pure and torch-free: the sweep service (`control.sweep`) then checks every point as a run before
any is made, and the TUI's compose form calls `vary` as you type.

Bad input is one line each (SweepError, exit 2): an unknown key (the closest one suggested), a key
a sweep cannot vary, a value of the wrong type, an empty list, zipped lists of different lengths,
a key given twice, more than MAX_SWEEP_POINTS points.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core import spec as specmod
from ..core.errors import UserError
from ..core.spec.schema import MAX_SWEEP_POINTS, SweepSection
from ..core.value import value

# Keys that place the sweep (its folder is <run_root>/<job.name>-<sweep id>): the same for every point.
FIXED_KEYS = ("job.name", "job.run_root")


class SweepError(UserError, ValueError):
    """A sweep refused before anything is made; one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


@value(frozen=True)
class Axis:
    """One varied key and its typed values; `zipped` axes advance together."""

    key: str
    values: tuple[Any, ...]
    zipped: bool = False


@value(frozen=True)
class Point:
    index: int
    values: dict[str, Any]

    def overrides(self) -> list[str]:
        """The point as `--set` items (values rendered as TOML, so `--set` types them back)."""
        return [f"{key}={specmod.render_value(value)}" for key, value in self.values.items()]

    def describe(self) -> str:
        return " ".join(f"{key}={specmod.render_value(value)}" for key, value in self.values.items())


def parse_item(item: str, flag: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` (or `KEY=[V1, V2]`, a TOML array, for values holding commas): the key and
    its values, each a TOML literal or a bare word (a string), as `--set` reads one value."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SweepError([f"{flag} {item}: expected KEY=V1,V2,... e.g. {flag} train.lr=1e-4,3e-4"])
    raw = raw.strip()
    if raw.startswith("["):
        try:
            values = tomllib.loads(f"v = {raw}")["v"]
        except (ValueError, RecursionError):
            raise SweepError([f"{flag} {key}: {raw[:60]!r} is not a TOML array"]) from None
        return key, list(values)
    parts = [p.strip() for p in raw.split(",")] if raw else []
    return key, [_literal(p) for p in parts if p]


def render_values(values: Sequence[Any]) -> str:
    """Values as `parse_item` reads them back: `V1, V2`, or a TOML array where a value holds a
    comma or is an array itself."""
    texts = [specmod.render_value(v) for v in values]
    if any("," in t or t.startswith("[") for t in texts):
        return specmod.render_value(list(values))
    return ", ".join(texts)


def fixed_reason(key: str) -> str | None:
    """Why a sweep cannot vary `key` (every point shares it), or None when it can."""
    if key in FIXED_KEYS or key == "env" or key.startswith("env."):
        return f"a sweep cannot vary {key} (its points share it)"
    if key == "slurm.max_gpu_hours":
        return f"a sweep cannot vary {key} (it bounds the sweep as a whole: its points share it)"
    return None


def _literal(raw: str) -> Any:
    data: dict[str, Any] = {}
    specmod.apply_overrides(data, [f"x.v={raw}"])
    return data["x"]["v"]


def axes(table: SweepSection, grid: list[str], zipped: list[str]) -> list[Axis]:
    """The varied keys, typed: the [sweep] table's, then the command line's (which replaces a key
    the table names)."""
    given: dict[str, tuple[list[Any], bool, str]] = {}
    for key, values in table.grid.items():
        given[key] = (values, False, "sweep.grid")
    for key, values in table.zip.items():
        given[key] = (values, True, "sweep.zip")
    errors: list[str] = []
    seen: set[str] = set()
    for flag, items, is_zip in (("--grid", grid, False), ("--zip", zipped, True)):
        for item in items:
            key, values = parse_item(item, flag)
            if key in seen:
                errors.append(f"{flag} {key}: given twice")
            seen.add(key)
            given[key] = (values, is_zip, flag)
    out = []
    for key, (values, is_zip, origin) in given.items():
        try:
            out.append(Axis(key, tuple(_typed(key, values, origin)), is_zip))
        except SweepError as e:
            errors += e.errors
    lengths = {len(a.values) for a in out if a.zipped}
    if len(lengths) > 1:
        detail = ", ".join(f"{a.key} has {len(a.values)}" for a in out if a.zipped)
        errors.append(f"zipped lists must have one length: {detail}")
    if errors:
        raise SweepError(errors)
    if not out:
        raise SweepError(["nothing to sweep: give --grid KEY=V1,V2 (or --zip), or a [sweep] table in the job file"])
    return out


def _typed(key: str, values: list[Any], origin: str) -> list[Any]:
    """The values typed by the schema (ints widened to float where a float is declared)."""
    tp = specmod.key_type(key)
    if tp is None:
        raise SweepError([f"{origin} {specmod.unknown_key_line(key)}"])
    if (why := fixed_reason(key)) is not None:
        raise SweepError([f"{origin} {key}: {why}"])
    if not values:
        raise SweepError([f"{origin} {key}: an empty list (give at least one value)"])
    typed = []
    for given in values:
        try:
            typed.append(specmod.coerce(key, tp, given))
        except specmod.SpecError as e:
            raise SweepError([f"{origin} {line}" for line in e.errors]) from None
    return typed


def count(axes_: list[Axis]) -> int:
    grid = math.prod(len(a.values) for a in axes_ if not a.zipped)
    zipped = [a for a in axes_ if a.zipped]
    return grid * (len(zipped[0].values) if zipped else 1)


def points(axes_: list[Axis]) -> list[Point]:
    """Every point, the grid's last key varying fastest, the zipped keys innermost; refused above
    MAX_SWEEP_POINTS before any is built."""
    n = count(axes_)
    if n > MAX_SWEEP_POINTS:
        raise SweepError([f"the sweep has {n} points; at most {MAX_SWEEP_POINTS} (docs/sweeps.md): split it"])
    grid = [a for a in axes_ if not a.zipped]
    zipped = [a for a in axes_ if a.zipped]
    keys = [a.key for a in zipped]
    rows = [dict(zip(keys, vals, strict=True)) for vals in zip(*(a.values for a in zipped), strict=True)]
    out = []
    for combo in itertools.product(*(a.values for a in grid)):
        for row in rows or [{}]:
            out.append(Point(len(out), {**dict(zip([a.key for a in grid], combo, strict=True)), **row}))
    return out


def read_table(text: str) -> SweepSection:
    """A job's [sweep] table, typed (an empty one when it has none); loading the job checked it
    already, so a SpecError here only repeats what `load` says."""
    value = tomllib.loads(text).get("sweep", {})
    return specmod.coerce("sweep", SweepSection, value)


def has_table(job: Path) -> bool:
    """The job file has a [sweep] table that varies something (`submit` refuses it)."""
    try:
        table = read_table(specmod.read_job_file(job))
    except (specmod.SpecError, tomllib.TOMLDecodeError, OSError):
        return False
    return bool(table.grid or table.zip)


@value(frozen=True)
class Varied:
    """A sweep's points, each checked as a job spec; not yet as a run (sources, data, backend:
    `Sweep.plan` does that)."""

    job: specmod.JobText  # what the points vary (`vary`'s overrides not applied)
    name: str  # the job's name
    axes: list[Axis]
    points: list[Point]
    specs: list[specmod.JobSpec]  # point i's, paths absolute
    shared: list[str]  # the overrides every point gets besides its own values (`at_point`)
    max_parallel: int

    @property
    def keys(self) -> list[str]:
        return [a.key for a in self.axes]


def vary(
    job: specmod.JobText,
    *,
    grid: Sequence[str] = (),
    zipped: Sequence[str] = (),
    max_parallel: int | None = None,
    overrides: Sequence[str] = (),
    values: SweepSection | None = None,
) -> Varied:
    """The job's points, each loaded and checked as a job spec. The varied keys: the job's [sweep]
    table, `values` (the notebook's, Python values) over it, then `grid`/`zipped` (the command
    line's `KEY=V1,V2` items) over both. The first point that fails is named (SweepError)."""
    base = job.load(overrides)
    table = read_table(job.text)
    if values is not None:
        table.grid.update(values.grid)
        table.zip.update(values.zip)
    varied = axes(table, list(grid), list(zipped))
    pts = points(varied)
    parallel = table.max_parallel if max_parallel is None else max_parallel
    if parallel < 0:
        origin = "sweep.max_parallel =" if max_parallel is None else "--max-parallel"
        raise SweepError([f"{origin} {parallel}: expected 0 (no limit on Slurm, 1 locally) or more"])
    shared = [f"log.project={specmod.render_value(base.log.project or base.job.name)}"]
    specs = []
    for p in pts:
        with at_point(p, shared):
            specs.append(job.load([*overrides, *shared, *p.overrides()]))
    if over := specmod.sweep_budget_refusal(specs):
        raise SweepError([over])
    return Varied(job, base.job.name, varied, pts, specs, shared, parallel)


@contextlib.contextmanager
def at_point(point: Point, shared: list[str]) -> Iterator[None]:
    """Checks of one point: what they refuse becomes a SweepError whose lines name the point (and
    not the overrides that made it: its values are in the name)."""
    try:
        yield
    except UserError as e:
        own = [f"--set {item}: " for item in [*shared, *point.overrides()]]
        lines = [next((ln.removeprefix(o) for o in own if ln.startswith(o)), ln) for ln in e.lines]
        raise SweepError([f"point {point.index} ({point.describe()}): {line}" for line in lines]) from None
