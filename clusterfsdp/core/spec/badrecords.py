"""`data.bad_records`: what a prepare does with a record it cannot read (broken JSON, a missing
key, text that is not UTF-8, a conversation the chat template refuses). Parsed here, in the
control plane, so `validate` refuses a bad value before anything runs; applied by
`clusterfsdp/data/readers.py` (skipping) and `clusterfsdp/data/prepare.py` (the limit)."""

from __future__ import annotations

import re

from ..value import value

SYNTAX = "'error', 'skip', 'skip:N' (at most N records) or 'skip:P%' (at most P percent of the records)"


@value(frozen=True)
class BadRecords:
    """`skip`: bad records are left out and counted; at most `count` of them, or `percent` of
    the records read (None: no limit)."""

    skip: bool = False
    count: int | None = None
    percent: float | None = None

    def over(self, bad: int, records: int) -> bool:
        """Whether `bad` skipped records out of `records` read break the limit."""
        if not self.skip:
            return bad > 0
        if self.count is not None:
            return bad > self.count
        if self.percent is not None:
            return bad * 100 > self.percent * max(records, 1)
        return False

    def describe(self) -> str:
        if self.count is not None:
            return f"at most {self.count:,} bad records"
        return f"at most {self.percent:g}% bad records" if self.percent is not None else "no limit"


def parse(text: str) -> BadRecords | None:
    """The policy `text` names, or None when it is not one (see SYNTAX)."""
    m = re.fullmatch(r"(error|skip)(?::(\d{1,18}(?:\.\d{1,6})?)(%?))?", text.strip())
    if m is None or (m[1] == "error" and m[2]) or (m[2] and "." in m[2] and not m[3]):
        return None
    if m[1] == "error":
        return BadRecords()
    if m[2] is None:
        return BadRecords(skip=True)
    if m[3]:
        percent = float(m[2])
        return BadRecords(skip=True, percent=percent) if percent <= 100 else None
    return BadRecords(skip=True, count=int(m[2]))
