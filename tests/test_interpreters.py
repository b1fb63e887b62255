"""Checkpoints load on every Python the project supports (issue 34 item 3).

CPython 3.11.0-3.11.6 pickle an enum member as `getattr(cls, name)`, 3.11.7 and later as
`cls(value)`; DCP's `.metadata` holds such members, and its safe unpickler (worker/safeload.py)
refused `builtins.getattr`, so no checkpoint written under Debian 12's own `python3` (3.11.2, the
documented platform) loaded: every resume, requeue and export failed. Here a checkpoint is written
by one interpreter and resumed and exported by the other, in both directions: the interpreter of
the suite's venv (`.ci/install` makes it from Debian's `/usr/bin/python3`) and the other Python
3.11 of this machine (CI's machines have both: Debian's 3.11.2 and a newer 3.11 first on PATH).
The other interpreter runs the same installed packages through a venv of its own whose `.pth`
adds the suite's site-packages (one ABI, cp311), so only the interpreter differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


def _version(python: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except OSError:
        return None
    return (int(out[0]), int(out[1]), int(out[2])) if len(out) == 3 else None


def other_interpreter() -> tuple[str, tuple[int, int, int]]:
    """The newest Python 3.<minor of the suite> on this machine other than the suite's own: every
    python3 / python3.11 on PATH (not only the first: .ci/test puts the venv's first) and Debian's."""
    ours = tuple(sys.version_info[:3])
    found: dict[tuple[int, int, int], str] = {}
    folders = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    candidates = ["/usr/bin/python3", *(os.path.join(d, n) for d in folders for n in ("python3", "python3.11"))]
    for where in candidates:
        if not os.access(where, os.X_OK):
            continue
        version = _version(where)
        if version and version[:2] == ours[:2] and version != ours:
            found.setdefault(version, where)
    assert found, (
        f"no second Python {ours[0]}.{ours[1]} on this machine besides the suite's {ours}: the cross-interpreter "
        "check needs Debian's /usr/bin/python3 and a newer one (see .ci/install)"
    )
    newest = max(found)
    return found[newest], newest


@pytest.fixture(scope="module")
def pythons(tmp_path_factory) -> dict[str, str]:
    """{'suite': the venv's python, 'other': a venv of the other interpreter over the same packages}."""
    other, version = other_interpreter()
    venv = tmp_path_factory.mktemp("other-venv")
    subprocess.run([other, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # `import` lines of a .pth run at start-up: addsitedir also runs the suite's own .pth files
    # (the editable install's finder), which a plain path line would not.
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "suite.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return {
        "suite": sys.executable,
        "other": str(venv / "bin" / "python"),
        "other_version": ".".join(map(str, version)),
    }


def _cli(python: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "clusterfsdp", *args], capture_output=True, text=True, timeout=300, env=env)


def _written_by_getattr(checkpoint: Path) -> bool:
    """Whether `.metadata` pickles enum members as getattr(cls, name): CPython 3.11.0-3.11.6."""
    return b"getattr" in (checkpoint / ".metadata").read_bytes()


@pytest.mark.parametrize("direction", ["suite->other", "other->suite"])
def test_a_checkpoint_written_by_one_python_resumes_and_exports_under_the_other(direction, pythons, tiny_job, tmp_path):
    writer, reader = direction.split("->")
    env = {**os.environ, "CLUSTERFSDP_RUN_ROOT": str(tmp_path / "runs")}
    for python in (pythons["suite"], pythons["other"]):  # each really is its own interpreter
        assert _version(python) is not None
    assert _version(pythons["suite"]) != _version(pythons["other"])
    sets = ["--set", "train.steps=10", "--set", "checkpoint.every_steps=5", "--set", "train.log_every=5"]
    r = _cli(pythons[writer], "submit", str(tiny_job), "--executor", "local", *sets, "--follow", env=env)
    assert r.returncode == 0 and "COMPLETED" in r.stderr, r.stdout + r.stderr
    (run,) = (tmp_path / "runs" / "tiny-cpu").iterdir()
    old = {who: _version(pythons[who]) < (3, 11, 7) for who in ("suite", "other")}  # type: ignore[operator]
    assert any(old.values()), f"neither Python writes the 3.11.0-3.11.6 form: {pythons}"
    assert _written_by_getattr(run / "checkpoints" / "step-00000010") == old[writer]  # the writer wrote it
    r = _cli(pythons[reader], "resume", run.name, "--set", "train.steps=15", "--executor", "local", "--follow", env=env)
    assert r.returncode == 0 and "COMPLETED" in r.stderr, r.stdout + r.stderr
    assert "resumed from step-00000010 (step 10," in (run / "logs").joinpath(*_newest_log(run)).read_text()
    assert _written_by_getattr(run / "checkpoints" / "step-00000015") == old[reader]  # the reader trained on
    assert not (run / "checkpoints" / "set-aside").exists()  # nothing was judged unreadable
    for who in (writer, reader):  # the writer's checkpoint (step 10) exports under both interpreters
        r = _cli(pythons[who], "export", run.name, "--step", "10", "--to", str(tmp_path / f"export-{who}"), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (tmp_path / f"export-{who}" / "model.safetensors").is_file()
    assert (tmp_path / f"export-{writer}" / "model.safetensors").read_bytes() == (
        tmp_path / f"export-{reader}" / "model.safetensors"
    ).read_bytes()


def _newest_log(run: Path) -> tuple[str, str]:
    newest = max((run / "logs").iterdir(), key=lambda p: p.stat().st_mtime)
    return newest.name, "rank0.log"


class _Reduce:
    def __init__(self, *reduced):
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


def test_getattr_in_dcp_metadata_names_an_allowed_enums_member_and_nothing_else():
    """What Python 3.11.0-3.11.6 write (`getattr(enum class, member name)`) loads; getattr used for
    anything else (a method of an allowed class, a non-member name, a non-enum) is refused."""
    import io
    import pathlib
    import pickle

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from clusterfsdp.worker.safeload import _MetadataUnpickler

    def load(obj) -> object:
        return _MetadataUnpickler(io.BytesIO(pickle.dumps(obj))).load()

    member = next(iter(_MEM_FORMAT_ENCODING))
    assert load(_Reduce(getattr, (_MEM_FORMAT_ENCODING, member.name))) is member
    for attack in (
        (pathlib.Path, "unlink"),  # Path is allowed, its methods are not
        (_MEM_FORMAT_ENCODING, "__init_subclass__"),
        (_MEM_FORMAT_ENCODING, "_missing_"),
    ):
        with pytest.raises(pickle.UnpicklingError, match=r"not allowed in a DCP \.metadata file"):
            load(_Reduce(getattr, attack))
