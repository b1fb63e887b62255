"""A shared prepared-data cache is hostile (issue 29.1, data/trust.py): another user who prepares
a victim's key first, plants a lock naming a live process of theirs, or rewrites a shard must
not make the victim train on their tokens or wait forever. Real second user (`cfsdp-other`,
tests/users.py), real files, a shared cache folder of mode 1777."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from data_helpers import documents, job, write_jsonl

from clusterfsdp.core import ownership
from clusterfsdp.core.procs import ProcessId
from clusterfsdp.data import cache, checks, rankdata, samples
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.sources import DataError

if TYPE_CHECKING:
    from users import OtherUser

pytest_plugins = ["users"]  # the fixtures other_user and shared_root
DOCS = documents(40)


def corpus(folder: Path, text: str | None = None) -> Path:
    records = [{"text": text or d} for d in (DOCS if text is None else [text] * 40)]
    return write_jsonl(folder / "d.jsonl", records)


def planted_entry(tmp: Path, key: str, other: OtherUser, root: Path) -> Path:
    """The attacker's tokens, prepared like any dataset and planted under the victim's key."""
    (tmp / "attacker").mkdir()
    spec = job(tmp / "attacker", [corpus(tmp / "attacker", "ATTACKER PAYLOAD")], "bytes")
    (theirs,) = dataprep.ensure(spec, workers=1)
    staged = tmp / "stage" / key
    shutil.copytree(theirs.folder, staged)
    return other.plant_copy(staged, root)


def test_an_entry_another_user_prepared_under_your_key_is_refused(tmp_path, other_user, shared_root):
    spec = job(tmp_path, [corpus(tmp_path)], "bytes", cache=shared_root)
    (ref,) = cache.dataset_refs(spec)
    planted = planted_entry(tmp_path, str(ref.key), other_user, shared_root)
    assert planted == ref.folder and planted.stat().st_uid == other_user.uid
    with pytest.raises(DataError) as e:
        dataprep.ensure(spec, workers=1)
    message = str(e.value)
    assert "\n" not in message and str(ref.folder) in message and f"belongs to {other_user.name}" in message
    assert checks.problems(spec) == [message]  # validate and submit refuse it before queueing


def test_a_lock_planted_by_another_user_is_refused_at_once(tmp_path, other_user, shared_root):
    """Their lock names a live process of theirs: the victim refuses it instead of waiting
    (without the check it waits for as long as that process lives)."""
    spec = job(tmp_path, [corpus(tmp_path)], "bytes", cache=shared_root)
    (ref,) = cache.dataset_refs(spec)
    sleeper = subprocess.Popen(
        ["setpriv", f"--reuid={other_user.uid}", f"--regid={other_user.gid}", "--clear-groups", "--", "sleep", "300"]
    )
    try:
        record = {**ProcessId.of(sleeper.pid).record(), "acquired": time.time(), "purpose": "prepare dataset"}
        other_user.plant(shared_root, {ref.lock_path.name: (json.dumps(record) + "\n").encode()})
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: _capture(errors, spec), daemon=True)
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "the victim is waiting on another user's lock"
    finally:
        sleeper.kill()
        sleeper.wait()
    (error,) = errors
    assert isinstance(error, DataError) and "\n" not in str(error)
    assert str(ref.lock_path) in str(error) and f"belongs to {other_user.name}" in str(error)
    assert f"pid {sleeper.pid}" in str(error)


def _capture(errors: list[BaseException], spec) -> None:
    try:
        dataprep.ensure(spec, workers=1)
    except BaseException as e:
        errors.append(e)


def test_a_rewritten_shard_is_detected_and_a_copied_cache_still_opens(tmp_path):
    spec = job(tmp_path, [corpus(tmp_path)], "bytes")
    (ref,) = dataprep.ensure(spec, workers=1, unit_bytes=1000)
    # copied elsewhere (new inodes and ctimes, same bytes): each file is hashed once and passes
    copy = tmp_path / "copied-cache"
    shutil.copytree(tmp_path / "cache", copy)
    moved = rankdata.open_for_training(job(tmp_path, [corpus(tmp_path)], "bytes", cache=copy), 0, print).train
    assert isinstance(moved, samples.PreparedSamples)
    assert [moved.sample(k).input_ids.tolist() for k in range(moved.count)]
    # one byte of a shard rewritten in place, same size
    shard = ref.folder / "shards" / "00001.tok"
    data = bytearray(shard.read_bytes())
    data[3] ^= 0x01
    shard.write_bytes(bytes(data))
    train = rankdata.open_for_training(spec, 0, print).train
    assert isinstance(train, samples.PreparedSamples)
    with pytest.raises(DataError, match=rf"{shard} was modified after it was prepared .* remove {ref.folder} "):
        for k in range(train.count):
            train.sample(k)


def test_a_world_writable_entry_is_refused_and_a_trusted_groups_is_used(tmp_path, other_user, shared_root, monkeypatch):
    spec = job(tmp_path, [corpus(tmp_path)], "bytes")
    (ref,) = dataprep.ensure(spec, workers=1)
    assert all(not p.stat().st_mode & 0o022 for p in [ref.folder, *ref.folder.rglob("*")])  # what the cache writes
    os.chmod(ref.folder / "manifest.json", 0o666)
    with pytest.raises(DataError, match=r"manifest.json .* is writable by every user"):
        ref.manifest()
    # an entry another user planted, carrying the group this user names as trusted: used
    victim = job(tmp_path, [corpus(tmp_path)], "bytes", cache=shared_root)
    (shared,) = cache.dataset_refs(victim)
    staged = tmp_path / "stage" / str(shared.key)
    shutil.copytree(ref.folder, staged)
    os.chmod(staged / "manifest.json", 0o644)
    other_user.plant_copy(staged, shared_root)
    with pytest.raises(DataError, match=f"belongs to {other_user.name}"):
        shared.manifest()
    monkeypatch.setenv(ownership.ENV_TRUSTED_GROUP, str(other_user.gid))
    assert checks.problems(victim) == []
    (used,) = dataprep.ensure(victim, workers=1)
    assert used.folder.stat().st_uid == other_user.uid
    assert rankdata.open_for_training(victim, 0, print).train is not None


def test_a_trusted_group_you_are_not_in_is_one_line_not_a_traceback(other_user, shared_root):
    """`data prepare` run by the other user with $CLUSTERFSDP_TRUSTED_GROUP naming a group it is
    not in (root): exit 2, one line; nothing prepared."""
    write_jsonl(shared_root / "d.jsonl", [{"text": d} for d in DOCS])
    job_file = shared_root / "job.toml"
    job_file.write_text(f'[data]\nsource = "files"\npaths = ["d.jsonl"]\ncache_dir = "{shared_root / "cache"}"\n')
    for path in (shared_root / "d.jsonl", job_file):
        path.chmod(0o644)
    env = {**os.environ, ownership.ENV_TRUSTED_GROUP: "root"}
    done = other_user.run([sys.executable, "-m", "clusterfsdp.data.prepare", str(job_file)], env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: ${ownership.ENV_TRUSTED_GROUP}: cannot give {shared_root / 'cache'} the group root: "
        "you are not a member of it"
    ]
