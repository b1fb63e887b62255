"""The schema as text: `clusterfsdp schema [KEY]`, the key list of shell completion, and the
commented starter file of `clusterfsdp init`, all generated from the fields' docstrings.
"""

from __future__ import annotations

import dataclasses
import typing

from .codec import plain, render_key, render_value, to_dict, unknown_key
from .schema import (
    SECTIONS,
    JobSpec,
    SpecError,
    SweepSection,
    hints,
    section_class,
    section_fields,
    toml_key,
    type_name,
)


def describe_schema(selector: str = "") -> list[str]:
    """Lines documenting every key (or those under `selector`, e.g. 'slurm' or 'train.lr'); a
    selector that names no section, table or key is a SpecError that suggests the closest one."""
    if selector:
        _check_selector(selector)
    lines = []
    if selector.split(".")[0] == "sweep":  # `clusterfsdp sweep`'s table, beside the run's sections
        under = selector.split(".", 1)[1] if "." in selector else ""
        return ["[sweep]  (read by `clusterfsdp sweep`; docs/sweeps.md)", *_describe_table(SweepSection, "", under)]
    for f in dataclasses.fields(JobSpec):
        if selector and f.name != selector.split(".")[0]:
            continue
        if f.name == "env":
            lines.append(f"[env]  table of strings\n    {f.metadata['doc']}")
            continue
        lines.append(f"[{f.name}]")
        lines += _describe_table(section_class(f.name), "", selector.split(".", 1)[1] if "." in selector else "")
    return lines


def _check_selector(selector: str) -> None:
    """Raise the loader's unknown-key error (closest name suggested) for the first part of
    `selector` that names no section, table or key; any name under [env] is a variable."""
    parts = selector.split(".")
    if parts[0] == "sweep":
        keys = [toml_key(f) for f in dataclasses.fields(SweepSection)]
        if len(parts) > 2 or (len(parts) == 2 and parts[1] not in keys):
            raise SpecError([unknown_key(selector, parts[-1], keys)])
        return
    if parts[0] == "env":
        if len(parts) > 2:
            raise SpecError([f"{selector}: [env] holds variables (env.NAME), not tables"])
        return
    keys = key_paths()
    known = list(dict.fromkeys(".".join(k.split(".")[:n]) for k in keys for n in range(1, k.count(".") + 2)))
    known += [s for s in SECTIONS if s not in known]
    for n in range(1, len(parts) + 1):
        here, parent = ".".join(parts[:n]), parts[: n - 1]
        if here in known:
            continue
        if ".".join(parent) in keys:
            raise SpecError([f"{here}: {'.'.join(parent)} is a key, not a table"])
        siblings = [k.split(".")[-1] for k in known if k.count(".") == n - 1 and k.split(".")[: n - 1] == parent]
        raise SpecError([unknown_key(here, parts[n - 1], siblings)])


def key_paths() -> list[str]:
    """Every key as it is written with --set: `section.key`, nested tables' as `slurm.container.kind`."""

    def walk(cls: type, prefix: str) -> list[str]:
        out = []
        for f in dataclasses.fields(cls):
            tp = hints(cls)[f.name]
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                out += walk(tp, f"{prefix}{toml_key(f)}.")
            else:
                out.append(prefix + toml_key(f))
        return out

    return [k for name in SECTIONS if name != "env" for k in walk(section_class(name), f"{name}.")]


def _describe_table(cls: type, prefix: str, selector: str) -> list[str]:
    """Schema lines of one table's keys (nested tables' keys as `table.key`) under `selector`."""
    lines = []
    for sf in dataclasses.fields(cls):
        key = prefix + toml_key(sf)
        if selector and not (key == selector or key.startswith(selector + ".") or selector.startswith(key + ".")):
            continue
        tp = hints(cls)[sf.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if not selector or selector == key or key.startswith(selector + "."):
                lines.append(f"  {key}    (table)\n      {sf.metadata['doc']}")
            lines += _describe_table(tp, key + ".", selector)
            continue
        lines.append(
            f"  {key} = {render_value(plain(getattr(cls(), sf.name)))}    ({type_name(tp)})\n      {sf.metadata['doc']}"
        )
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(item) and isinstance(item, type):  # [[key]] tables: their keys as key[].name
            lines += _describe_table(item, key + "[].", "")
    return lines


def starter_toml(spec: JobSpec | None = None) -> str:
    """A commented job.toml with every key, its default and its docstring."""
    spec = spec or JobSpec()
    data = to_dict(spec)
    out = [
        "# clusterfsdp job spec. Every key is optional; values shown are the defaults.",
        "# `clusterfsdp schema` documents each key; `clusterfsdp validate` checks the file.",
        "",
    ]
    for f in dataclasses.fields(JobSpec):
        out.append(f"[{f.name}]")
        if f.name == "env":
            out.append(f"# {f.metadata['doc']}")
            out += [f"{render_key(k)} = {render_value(v)}" for k, v in spec.env.items()] or ['# NCCL_DEBUG = "WARN"']
            out.append("")
            continue
        for key, sf in section_fields(f.name).items():
            out.append(f"# {sf.metadata['doc']}")
            out.append(f"{key} = {render_value(data[f.name][key])}")
        out.append("")
    return "\n".join(out)
