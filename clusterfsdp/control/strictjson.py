"""Strict JSON for every `--json` output: Python's json writes a float that is not finite (a loss
of NaN or inf after a divergence) as NaN/Infinity, which is not JSON: jq, JavaScript and strict
parsers refuse the whole document. Such a number is written as null; the run's reason and notes
say what happened (docs/json.md). Apart from jsonout so that commands that print JSON without
run records (`sweep --dry-run --json`) do not import them: start-up is paid on every call."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every float that is not finite, at any depth, as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """One indented, strict JSON document of plain data (dicts, lists, numbers, strings)."""
    return json.dumps(finite(value), indent=2, sort_keys=sort_keys, allow_nan=False)
