"""The compose form's model: one field per job.toml key, generated from the spec package's schema.

Nothing is re-described here: names, types, defaults and help text come from the dataclasses,
and validation is `spec.from_dict`, so the form reports exactly what `clusterfsdp validate`
reports, and a key added to the schema appears in the form without touching the TUI.

Any field can be a list of values instead (`lists`: its text as `clusterfsdp sweep --grid` reads
it): the job is then a sweep, its lists the [sweep] table's grid, each point checked as the
sweep service checks it (`sweepplan.vary`).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomli_w

from clusterfsdp.control import sweepplan
from clusterfsdp.core import modelsource
from clusterfsdp.core import spec as specmod
from clusterfsdp.core.errors import UserError
from clusterfsdp.core.presets import PRESETS

Kind = Literal["bool", "choice", "text", "number", "time", "toml"]


# Text keys whose valid values are a table's keys: offered as a choice list, read from the table
# each time, so a preset added to presets.PRESETS appears without touching the form.
TABLE_CHOICES = {"model.preset": lambda: tuple(PRESETS)}


@dataclass(frozen=True)
class FormField:
    section: str
    key: str
    annotation: Any
    doc: str
    default: Any

    @property
    def path(self) -> str:
        return f"{self.section}.{self.key}" if self.key else self.section

    @property
    def kind(self) -> Kind:
        tp, origin = self.annotation, get_origin(self.annotation)
        if tp is bool:
            return "bool"
        if origin is Literal or self.path in TABLE_CHOICES:
            return "choice"
        if tp is str:
            return "text"
        if tp in (int, float):
            return "number"
        if origin in (types.UnionType, typing.Union) and set(get_args(tp)) == {int, str}:
            return "time"  # a whole number or Slurm's text form: slurm.time and time_min, a node range "2-8"
        return "toml"

    @property
    def choices(self) -> tuple[Any, ...]:
        if self.path in TABLE_CHOICES:
            return TABLE_CHOICES[self.path]()
        return get_args(self.annotation) if self.kind == "choice" else ()

    @property
    def type_label(self) -> str:
        label = specmod.type_name(self.annotation)
        return f"{label} (TOML)" if self.kind == "toml" else label


def form_fields() -> list[FormField]:
    """Every key of every section, in schema order; [env] is one table-valued field."""
    out = []
    for sf in dataclasses.fields(specmod.JobSpec):
        if sf.name == "env":
            out.append(FormField("env", "", dict[str, str], sf.metadata["doc"], {}))
            continue
        cls = type(getattr(specmod.JobSpec(), sf.name))
        hints = typing.get_type_hints(cls)
        defaults = cls()
        for key, f in specmod.section_fields(sf.name).items():
            default = specmod.plain(getattr(defaults, f.name))  # nested tables ([slurm.container]) as dicts
            out.append(FormField(sf.name, key, hints[f.name], f.metadata["doc"], default))
    return out


FIELDS = form_fields()
BY_PATH = {f.path: f for f in FIELDS}
SECTIONS = list(dict.fromkeys(f.section for f in FIELDS))


def display(field: FormField, value: Any) -> Any:
    """How a value is shown: text for inputs, the value itself for switches and choices."""
    if field.kind in ("bool", "choice"):
        return value
    if field.kind == "text" and isinstance(value, str):
        return value
    if field.kind == "time" and isinstance(value, (int, str)) and not isinstance(value, bool):
        return str(value)
    return specmod.render_value(value)


def parse(field: FormField, raw: Any) -> tuple[Any, str | None]:
    """A widget's value as the TOML value it stands for, or an error in validate's format.

    Numbers and tables are TOML literals; a number that does not parse is passed on as text, so
    the message is validate's own ("expected integer, found string 'x'").
    """
    kind = field.kind
    if kind in ("bool", "choice", "text"):
        return raw, None
    text = str(raw).strip()
    if kind == "time":
        return (int(text) if re.fullmatch(r"\d+", text) else text), None
    if kind == "toml" and not text:
        return type(field.default)(), None
    try:
        return tomllib.loads(f"v = {text}")["v"], None
    except tomllib.TOMLDecodeError as e:
        if kind == "number":
            return text, None
        example = '["a.txt", "b.txt"]' if get_origin(field.annotation) is list else '{ KEY = "value" }'
        return raw, f"{field.path}: not a TOML value ({e}); e.g. {example}"


def list_text(f: FormField, raw: Any) -> str:
    """A field's value as a list of one value: what turning the field into a list starts from."""
    value, error = parse(f, raw)
    return str(raw) if error else sweepplan.render_values([value])


def to_data(
    values: dict[str, Any], keep: set[str] | None = None, sweep: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Parsed values (and a [sweep] table) as TOML data. With `keep`, only keys in it or differing
    from the default (what saving writes, so a short file stays short)."""
    data: dict[str, Any] = {}
    for f in FIELDS:
        value = values[f.path]
        if keep is not None and f.path not in keep and value == f.default:
            continue
        if f.section == "env":
            data["env"] = value
        else:
            data.setdefault(f.section, {})[f.key] = value
    if sweep:
        data["sweep"] = sweep
    return data


@dataclass
class Review:
    """The form checked: every error, the same lines `clusterfsdp validate` prints, by field."""

    values: dict[str, Any]  # parsed; a field that does not parse keeps its default here
    spec: specmod.JobSpec | None  # None while there are errors; a sweep's: the job its points vary
    errors: list[str]
    table: dict[str, Any] = field(default_factory=dict)  # [sweep]: the lists as its grid, and what else the file had
    sweep: sweepplan.Varied | None = None  # the points, when the table varies something and they all check

    def for_field(self, path: str) -> list[str]:
        return [e for e in self.errors if field_of(e) == path]

    @property
    def general(self) -> list[str]:
        return [e for e in self.errors if field_of(e) is None]


def review(raw: dict[str, Any], present: Collection[str] = ()) -> Review:
    """Parse every editor's value and validate the whole job, collecting all errors at once.

    What is checked is what saving writes (`to_data` with `present`, the keys the opened file
    had): a field at its default that the file did not name is left to the schema's default, as
    `clusterfsdp validate` leaves a key the file lacks. So the form's own defaults never conflict
    with what was given (train.steps' 100 beside a file's train.epochs: that file is valid)."""
    values, errors = {}, []
    for f in FIELDS:
        value, error = parse(f, raw[f.path])
        values[f.path] = f.default if error else value
        errors += [error] if error else []
    try:
        spec = specmod.from_dict(to_data(values, keep=set(present)))
    except specmod.SpecError as e:
        return Review(values, None, errors + e.errors)
    return Review(values, None if errors else spec, errors)


def check_sources(review: Review, base: Path) -> Review:
    """`review` plus the model and tokenizer checks `submit` makes before queueing (folders and the
    local HF cache only: no network on a keystroke). Paths are relative to `base`, the job's folder."""
    if review.spec is None:
        return review
    try:
        modelsource.prepare(specmod.with_absolute_paths(review.spec, base), mode="cache")
    except specmod.SpecError as e:
        return Review(review.values, None, review.errors + e.errors)
    return review


def sweep_table(lists: dict[str, str], rest: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The [sweep] table of a job whose fields in `lists` are lists of values (their text read as
    `--grid` reads it, in that order) and whose file's table had `rest` besides; the lists' errors."""
    grid, errors = dict(rest.get("grid", {})), []
    for path, text in lists.items():
        try:
            grid[path] = sweepplan.parse_item(f"{path}={text}", "sweep.grid")[1]
        except sweepplan.SweepError as e:
            errors += e.errors
    return {**rest, **({"grid": grid} if grid else {})}, errors


def review_job(
    raw: dict[str, Any], lists: dict[str, str], rest: dict[str, Any], base: Path, present: Collection[str] = ()
) -> Review:
    """The whole form checked (`review`, `check_sources`), its fields in `lists` being lists of
    values (`sweep_table`): each list's first value stands for the job's own value of its key (as
    the job file of `clusterfsdp sweep` must hold a valid one, and a saved file holds it), then
    every point is checked as a job spec as `clusterfsdp sweep` checks it. Errors name the point,
    or the list (`sweep.grid KEY: ...`)."""
    table, errors = sweep_table(lists, rest)
    grid = table.get("grid", {})
    firsts = {path: display(BY_PATH[path], grid[path][0]) for path in lists if grid.get(path)}
    checked = replace(check_sources(review({**raw, **firsts}, present), base), table=table)
    if errors:
        return replace(checked, spec=None, errors=checked.errors + errors)
    if checked.spec is None or not (grid or table.get("zip")):
        return checked
    try:
        varied = sweepplan.vary(specmod.JobText(dumps(to_data(checked.values, set(present), table)), base))
    except UserError as e:
        return replace(checked, spec=None, errors=checked.errors + e.lines)
    return replace(checked, sweep=varied)


# What a sweep's error line names before the key it is about: the list, or the point.
_SWEEP_CONTEXT = re.compile(r"sweep\.(grid|zip) |point \d+ \(.*?\): ")


def field_of(error: str) -> str | None:
    """The form field an error line is about ('slurm.extra.x: ...' -> 'slurm.extra'; a sweep's
    'sweep.grid train.lr: ...' and 'point 1 (train.lr=0.1): train.steps: ...' name theirs)."""
    if context := _SWEEP_CONTEXT.match(error):
        error = error[context.end() :]
    best = None
    for path in BY_PATH:
        at_field = error.startswith(path) and error[len(path) : len(path) + 1] in (":", ".", "[")
        if at_field and (best is None or len(path) > len(best)):
            best = path
    return best


@dataclass
class Opened:
    """A job.toml read into the form. A field its [sweep] grid varies is in `lists`, and has the
    first of those values in `values`: it stands for the key's own value (`review_job`)."""

    values: dict[str, Any]  # every field's
    present: set[str]  # the paths the file had
    problems: list[str]  # what no field can show: TOML syntax, unknown sections or keys (dropped)
    lists: dict[str, str] = field(default_factory=dict)  # fields the [sweep] grid varies: the values as text
    sweep: dict[str, Any] = field(default_factory=dict)  # the rest of [sweep] (zip, max_parallel), kept as it was


def new_job() -> Opened:
    return Opened({f.path: f.default for f in FIELDS}, set(), [])


def from_toml(text: str) -> Opened:
    """A job.toml's values for every field, and what no field can show as problems."""
    opened = new_job()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        opened.problems.append(f"not valid TOML: {e}")
        return opened
    values, present, problems = opened.values, opened.present, opened.problems
    for section, table in data.items():
        if section == "env":
            values["env"] = table
            present.add("env")
            continue
        if section == "sweep" and isinstance(table, dict):
            opened.lists, opened.sweep = _lists(table, problems)
            continue
        if section not in specmod.SECTIONS or not isinstance(table, dict):
            problems.append(f"{section}: not a section of job.toml (ignored)")
            continue
        for key, value in table.items():
            path = f"{section}.{key}"
            if path not in BY_PATH:
                problems.append(f"{path}: unknown key (ignored)")
                continue
            if BY_PATH[path].kind == "bool" and not isinstance(value, bool):
                problems.append(f"{path}: expected boolean, found {value!r} (the default is shown)")
                continue
            values[path] = value
            present.add(path)
    values.update({path: data["sweep"]["grid"][path][0] for path in opened.lists if data["sweep"]["grid"][path]})
    return opened


def _lists(table: dict[str, Any], problems: list[str]) -> tuple[dict[str, str], dict[str, Any]]:
    """A [sweep] table's grid lists of form fields as the fields' text, and the rest of the table."""
    rest = {k: v for k, v in table.items() if k != "grid"}
    grid = table.get("grid", {})
    if not isinstance(grid, dict):
        problems.append(f"sweep.grid: expected a table of lists, found {specmod.render_value(grid)} (ignored)")
        return {}, rest
    lists = {k: sweepplan.render_values(v) for k, v in grid.items() if k in BY_PATH and isinstance(v, list)}
    other = {k: v for k, v in grid.items() if k not in lists}  # nested keys (slurm.container.image), or bad
    return lists, {**rest, **({"grid": other} if other else {})}


def dumps(data: dict[str, Any]) -> str:
    return tomli_w.dumps(data)
