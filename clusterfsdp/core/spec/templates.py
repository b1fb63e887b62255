"""The templates of a [[data.sources]] entry (prompt, response, system): str.format text whose
fields are a record's column names. Here, in the spec, because loading refuses bad ones; the
data package renders them (data/fieldmap.py)."""

from __future__ import annotations

import string


def template_fields(template: str) -> list[str]:
    """The column names a template uses ({name}); ValueError for a template str.format refuses
    or a field with an attribute, an index or a format ({a.b}, {a[0]}, {a:>4})."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"{{{name}}} is not a column name")
        names.append(name)
    return names
