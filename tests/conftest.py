"""Shared fixtures. Helpers that launch real worker processes live in tests/procs.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from procs import CORPUS  # noqa: E402  (tests/ is on sys.path from the line above)


@pytest.fixture
def tiny_job(tmp_path: Path) -> Path:
    """jobs/tiny-cpu.toml with its paths made absolute and runs going under tmp_path."""
    text = (REPO / "jobs" / "tiny-cpu.toml").read_text()
    text = text.replace('run_root = "../runs"', f'run_root = "{tmp_path / "runs"}"')
    text = text.replace('"data/corpus.txt"', f'"{CORPUS}"')
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def _no_inherited_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests decide themselves whether they run inside an allocation."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SRUN_", "SUBMITIT_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            monkeypatch.delenv(key, raising=False)


pytest_plugins = ["slurm_fixtures", "users"]  # `slurm_cluster` (real daemons); a second user (tests/users.py)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`.ci/test` runs `-n 2 --dist loadgroup`), the tests that drive the one
    devcluster run on one worker, one after another: run side by side they would wait for each
    other's nodes. Everything else spreads over the workers."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
