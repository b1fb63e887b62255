"""job.toml text <-> JobSpec: parsing with one error line per bad key (close names suggested),
`--set` overrides typed by the schema, and TOML output (whole specs, and single values for the
TUI form, the notebook's overrides and the starter file).

`from_dict` ends with the cross-field checks (`crossfield.check`), so every JobSpec it returns is
one that may be queued as far as the file alone can tell.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
import tomllib
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal, get_args, get_origin

from .. import fileio, secretenv
from .crossfield import check
from .schema import (
    SECTIONS,
    JobSpec,
    SpecError,
    SweepSection,
    closest,
    describe_value,
    hints,
    section_class,
    toml_key,
    type_name,
)
from .tokenizer import default_tokenizer

# Integers must fit the 64-bit integers of the programs they reach (Slurm, JSON readers, torch).
INT64 = range(-(2**63), 2**63)


# Free-form values (model.from_config, a sweep's lists) nest a few levels; one nested hundreds deep
# validated, then ran the writer of the run's job.toml (tomli_w) out of stack at submit.
MAX_NESTING = 32


def coerce(path: str, tp: Any, value: Any) -> Any:
    """Check `value` against the annotation `tp`; return it (ints widened to float) or raise SpecError."""
    origin = get_origin(tp)
    if type(value) is int and value not in INT64:
        raise SpecError([f"{path}: {describe_value(value)} does not fit in 64 bits"])
    if tp is Any:
        if isinstance(value, (list, dict)) and fileio.too_deep(value, MAX_NESTING):
            raise SpecError([f"{path}: lists and tables nested deeper than {MAX_NESTING} levels"])
        _check_plain(path, value)
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise SpecError([f"{path}: expected a table, found {describe_value(value)}"])
        errors: list[str] = []
        table = _table(path, tp, value, errors)
        if errors:
            raise SpecError(errors)
        return table
    if origin is Literal:
        choices = get_args(tp)
        if value in choices and type(value) is type(choices[0]):
            return value
        hint = ""
        if isinstance(value, str):
            close = closest(value, [str(c) for c in choices])
            hint = f"; did you mean {close!r}?" if close else ""
        raise SpecError([f"{path}: expected one of {type_name(tp)}, found {describe_value(value)}{hint}"])
    if origin in (types.UnionType, typing.Union):
        for option in get_args(tp):
            try:
                return coerce(path, option, value)
            except SpecError:
                pass
        raise SpecError([f"{path}: expected {type_name(tp)}, found {describe_value(value)}"])
    if origin is list:
        if not isinstance(value, list):
            raise SpecError([f"{path}: expected {type_name(tp)}, found {describe_value(value)}"])
        (item,) = get_args(tp)
        return [coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError([f"{path}: expected a table, found {describe_value(value)}"])
        _, vt = get_args(tp)
        return {str(k): coerce(f"{path}.{k}", vt, v) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp in (int, float, str, bool) and type(value) is tp:
        _check_plain(path, value)
        return value
    raise SpecError([f"{path}: expected {type_name(tp)}, found {describe_value(value)}"])


def _check_plain(path: str, value: Any) -> None:
    """A value every consumer can take: strings without NUL, finite numbers, booleans, and for
    free-form values (model.from_config goes into a JSON config.json) lists and tables of them;
    no dates (JSON has none)."""
    if isinstance(value, dict):
        for k, v in value.items():
            coerce(f"{path}.{k}", Any, v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            coerce(f"{path}[{i}]", Any, v)
    elif type(value) is float and not math.isfinite(value):
        raise SpecError([f"{path}: expected a finite number, found {value!r}"])
    elif type(value) is str and "\x00" in value:
        raise SpecError([f"{path}: contains a NUL character"])
    elif type(value) not in (str, int, float, bool):
        raise SpecError([f"{path}: expected a string, number, boolean, list or table, found {describe_value(value)}"])


def unknown_key(path: str, key: str, valid: list[str]) -> str:
    """The error line of an unknown key: the closest valid name, else the valid names."""
    close = closest(key, valid)
    hint = f"; did you mean {close}?" if close else f"; valid keys: {', '.join(valid)}"
    return f"{path}: unknown key{hint}"


def from_dict(data: dict[str, Any]) -> JobSpec:
    """Build a JobSpec from parsed TOML, collecting every error, then run cross-field checks."""
    errors: list[str] = []
    spec = JobSpec()
    for name, value in data.items():
        if name not in SECTIONS and name != "sweep":
            errors.append(unknown_key(name, name, [*SECTIONS, "sweep"]))
            continue
        if name == "sweep":  # `clusterfsdp sweep`'s table (control.sweep): typed here, no part of a run's spec
            _table("sweep", SweepSection, value, errors) if isinstance(value, dict) else errors.append(
                f"sweep: expected a table [sweep], found {describe_value(value)}"
            )
            continue
        if name == "env":
            try:
                spec.env = coerce("env", dict[str, str], value)
            except SpecError as e:
                errors += e.errors
            continue
        if not isinstance(value, dict):
            errors.append(f"{name}: expected a table [{name}], found {describe_value(value)}")
            continue
        setattr(spec, name, _table(name, section_class(name), value, errors))
    errors += _steps_or_epochs(spec, data.get("train"))
    if errors:
        raise SpecError(errors)
    spec = default_tokenizer(spec)
    check(spec)
    return spec


def _steps_or_epochs(spec: JobSpec, train: Any) -> list[str]:
    """train.epochs > 0 replaces train.steps, which is then 0 (derived by the job from the
    prepared data): an error when the job file gives a nonzero train.steps too."""
    if not spec.train.epochs > 0:
        return []
    if isinstance(train, dict) and train.get("steps", 0) != 0:
        return ["train.steps and train.epochs: give one of them (train.epochs derives the steps from the data)"]
    spec.train.steps = 0
    return []


def _table(path: str, cls: type, value: dict[str, Any], errors: list[str]) -> Any:
    """An instance of the dataclass `cls` (a section or a nested table like [slurm.container])
    from a TOML table: defaults for missing keys, one error per unknown or mistyped key."""
    fields = {toml_key(f): f for f in dataclasses.fields(cls)}
    types_of = hints(cls)
    table = cls()
    for key, v in value.items():
        here = f"{path}.{key}"
        if key not in fields:
            errors.append(unknown_key(here, key, list(fields)))
            continue
        try:
            setattr(table, fields[key].name, coerce(here, types_of[fields[key].name], v))
        except SpecError as e:
            errors += e.errors
    return table


def loads(text: str, overrides: Sequence[str] = ()) -> JobSpec:
    """A checked JobSpec from job.toml text and `--set` overrides."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise SpecError(["not valid TOML: arrays or tables nested too deeply"]) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError([f"not valid TOML: {_one_line(e)}"]) from None
    except ValueError:  # int(): more digits than Python converts
        raise SpecError([f"not valid TOML: an integer of more than {sys.get_int_max_str_digits()} digits"]) from None
    apply_overrides(data, overrides)
    return from_dict(data)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]


def override_label(item: str) -> str:
    """How an error line names a `--set` override: `--set KEY=VALUE` (long values cut)."""
    return f"--set {item if len(item) <= 80 else item[:77] + '...'}"


def override_of(line: str, overrides: Sequence[str]) -> str | None:
    """The last override that set the key an error line starts with (or a table holding it)."""
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if line.startswith((f"{key}: ", f"{key}.", f"{key}[")):
            return item
    return None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """Apply `section.key=value` overrides in place; values are TOML literals, bare words are strings."""
    errors = []
    for item in overrides:
        path, sep, raw = item.partition("=")
        parts = path.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            errors.append(f"{override_label(item)}: expected section.key=value, e.g. train.lr=3e-4")
            continue
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except (ValueError, RecursionError):  # not TOML (or an integer of too many digits, nested too deep)
            value = raw  # a bare word, like partition=gpu
        target = data
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                errors.append(f"{override_label(item)}: {part} is not a table")
                break
        else:
            if _field_type(parts) is str and not isinstance(value, str):
                value = raw  # a str field (or an [env] value) given 123 or true means the text
            target[parts[-1]] = value
    if errors:
        raise SpecError(errors)


def key_type(key: str) -> Any:
    """The annotation of a `--set` key (`train.lr`, `slurm.container.kind`), or None if unknown."""
    parts = key.split(".")
    return _field_type(parts) if len(parts) >= 2 and all(parts) else None


def unknown_key_line(key: str) -> str:
    """Why `key` names no field, with the closest name (the loader's words)."""
    parts = key.split(".")
    if parts[0] not in SECTIONS:
        return unknown_key(key, parts[0], list(SECTIONS))
    tp: Any = section_class(parts[0]) if parts[0] != "env" else None
    for i, part in enumerate(parts[1:], 1):
        if not (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
            return f"{key}: {'.'.join(parts[:i])} is a key, not a table"
        names = {toml_key(f): f for f in dataclasses.fields(tp)}
        if part not in names:
            return unknown_key(key, part, list(names))
        tp = hints(tp)[names[part].name]
    return f"{key}: a table, not a key"


def _field_type(parts: list[str]) -> Any:
    """The annotation of the key at `parts` (section, key, nested key...), or None if unknown."""
    if parts[0] == "env":
        return str if len(parts) == 2 else None
    if parts[0] not in SECTIONS:
        return None
    tp: Any = section_class(parts[0])
    for part in parts[1:]:
        if not (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
            return None
        f = {toml_key(f): f for f in dataclasses.fields(tp)}.get(part)
        if f is None:
            return None
        tp = hints(tp)[f.name]
    return tp


def to_dict(spec: JobSpec, *, redact: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(JobSpec):
        if f.name == "env":
            out["env"] = secretenv.redacted(spec.env) if redact else dict(spec.env)
            continue
        out[f.name] = plain(getattr(spec, f.name))
    return out


def plain(value: Any) -> Any:
    """A section or nested table as TOML data (dataclasses become tables keyed by TOML key)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {toml_key(f): plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):  # [[key]] tables
        return [plain(v) for v in value]
    return copy.deepcopy(value)


def dumps(spec: JobSpec, *, redact: bool = False) -> str:
    import tomli_w  # here, not at import: `validate` writes no TOML (start-up, issue 25 item 3)

    return tomli_w.dumps(to_dict(spec, redact=redact))


def secret_env(spec: JobSpec) -> dict[str, str]:
    """The [env] entries that look like secrets; they travel in the process environment, never in files."""
    return secretenv.values(spec.env)


def render_value(value: Any) -> str:
    """One TOML value on one line (tables inline): what `--set KEY=VALUE` takes, and the starter file shows."""
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{render_key(k)} = {render_value(v)}" for k, v in value.items()) + " }" if value else "{}"
        )
    if isinstance(value, list):  # tomli_w writes arrays one item a line
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    # only where TOML is written: `validate` stays within its module count (tests/test_cli.py)
    import tomli_w

    return tomli_w.dumps({"v": value}).strip()[4:]


def render_key(key: str) -> str:
    """A TOML key, quoted only when it must be."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else render_value(key)
