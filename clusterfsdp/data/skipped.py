"""The account of records a prepare left out as unreadable (data.bad_records = 'skip'): summed
from the shards' stats into the manifest, held to the policy's limit (when the dataset is built
and again whenever a job reuses it, since the limit is not part of the key), and the lines that
`data prepare`, a job's log and `validate` show. Pure Python (validate imports it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.spec import badrecords
from .sources import DataError

BAD_KEPT = 100  # error lines of skipped records kept per shard (and in the manifest)
SHOWN = 3  # locations a summary line names


def summary(policy_text: str, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's `bad_records` entry from the shards' stats (in shard order); DataError naming
    the record that crossed the policy's limit."""
    policy = badrecords.parse(policy_text) or badrecords.BadRecords()
    records = sum(s["records"] for s in stats)
    bad = sum(s["bad"] for s in stats)
    first = [line for s in stats for line in s["bad_at"]][:BAD_KEPT]
    if policy.over(bad, records):
        raise DataError(_crossing(policy_text, policy, stats, records, bad))
    return {"policy": policy_text, "records": records, "skipped": bad, "first": first}


class EarlyLimit:
    """Stops a prepare as soon as the shards written so far hold more bad records than a
    'skip:N' policy allows, instead of after tokenizing the rest (a share, 'skip:P%', is of all
    the records, so only the end can tell). The error is `summary`'s, over the complete shards."""

    def __init__(self, policy_text: str, shards: Path):
        self.policy_text, self.shards, self.bad = policy_text, shards, 0
        policy = badrecords.parse(policy_text)
        self.count = policy.count if policy is not None and policy.skip else None

    def written(self, stats: Any) -> None:
        """After each new shard (a ShardStats)."""
        self.bad += stats.bad
        if self.count is not None and self.bad > self.count:
            done = sorted(self.shards.glob("[0-9]*.json"), key=lambda p: int(p.stem))
            summary(self.policy_text, [json.loads(p.read_text()) for p in done])  # raises


def _crossing(text: str, policy: badrecords.BadRecords, stats: list[dict[str, Any]], records: int, bad: int) -> str:
    if policy.count is None:  # a share: no one record crosses it, the whole count does
        first = next(line for s in stats for line in s["bad_at"])
        return f"{first} (and {bad - 1:,} more of {records:,} records cannot be read: over data.bad_records = {text!r})"
    seen = 0
    for n, s in enumerate(stats):
        if seen + s["bad"] > policy.count:
            k = policy.count - seen  # the crossing record's place among this shard's bad ones
            where = s["bad_at"][k] if k < len(s["bad_at"]) else f"bad record {k + 1} of shard {n}"
            return f"{where} (bad record {policy.count + 1:,}: over data.bad_records = {text!r})"
        seen += s["bad"]
    raise AssertionError("over the limit but no shard crosses it")


def reuse_problem(policy_text: str, role: str, manifest: dict[str, Any]) -> str | None:
    """The error line when a prepared dataset holds more skipped records than this job allows."""
    entry = manifest.get("bad_records")
    policy = badrecords.parse(policy_text)
    if entry is None or policy is None or not policy.over(int(entry["skipped"]), int(entry["records"])):
        return None
    first = f"; the first: {entry['first'][0]}" if entry["first"] else ""
    return (
        f"data.bad_records: the prepared {role} data left out {entry['skipped']:,} of {entry['records']:,} "
        f"records that cannot be read (prepared with {entry['policy']!r}), over {policy_text!r}{first}"
    )


def lines(role: str, manifest: dict[str, Any]) -> list[str]:
    """'train: N of M records skipped ...' and the first locations, when any were skipped."""
    entry = manifest.get("bad_records")
    if not entry or not entry["skipped"]:
        return []
    out = [
        f"{role}: {entry['skipped']:,} of {entry['records']:,} records skipped as unreadable "
        f"(data.bad_records = {entry['policy']!r}; the first {min(len(entry['first']), BAD_KEPT)} in the manifest)"
    ]
    return out + [f"{role}:   {line}" for line in entry["first"][:SHOWN]]
