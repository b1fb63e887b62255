"""A second local user, for the tests of what another user of a shared login node can do to you.

The suite runs as root, so `other_user` creates the account `cfsdp-other` (once: useradd is
skipped when it exists, and a concurrent creation is accepted) and runs commands as it
(setpriv: its uid and gid, no supplementary groups). `shared_root` is a folder every user may
create runs in (mode 1777, like /scratch or a group's run root), outside the test's own tmp_path,
which other users cannot enter. conftest.py loads this module as a plugin, so every test can ask
for the fixtures.
"""

from __future__ import annotations

import base64
import json
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

OTHER = "cfsdp-other"
USERADD_EXISTS = 9  # useradd's exit status when the name is taken (another test created it first)

# Run as the other user: write the files given on stdin ({relative path: base64}) under argv[1].
_PLANT = """
import base64, json, sys
from pathlib import Path
root = Path(sys.argv[1])
for rel, data in json.load(sys.stdin).items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(data))
"""


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """`argv` as this user, from `/` (the test's tmp_path is closed to it)."""
        as_user = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        return subprocess.run([*as_user, *argv], cwd="/", capture_output=True, text=True, timeout=60, **kwargs)

    def plant(self, root: Path, files: dict[str, bytes]) -> None:
        """Write `files` (paths relative to `root`) as this user: they and their folders are its own."""
        payload = json.dumps({rel: base64.b64encode(data).decode() for rel, data in files.items()})
        done = self.run([sys.executable, "-I", "-c", _PLANT, str(root)], input=payload)
        assert done.returncode == 0, done.stderr

    def plant_copy(self, source: Path, root: Path) -> Path:
        """Plant a copy of the folder `source` (made by the test) as `root / source.name`."""
        files = {str(p.relative_to(source.parent)): p.read_bytes() for p in source.rglob("*") if p.is_file()}
        self.plant(root, files)
        return root / source.name


@pytest.fixture
def other_user() -> OtherUser:
    try:
        entry = pwd.getpwnam(OTHER)
    except KeyError:
        done = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", OTHER], capture_output=True, text=True)
        assert done.returncode in (0, USERADD_EXISTS), done.stderr
        entry = pwd.getpwnam(OTHER)
    return OtherUser(OTHER, entry.pw_uid, entry.pw_gid)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cfsdp-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
