"""Shared fixtures. Helpers that launch real worker processes live in tests/procs.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

import procs  # noqa: E402  (tests/ is on sys.path from the line above)
import rankserver  # noqa: E402
from procs import CORPUS, allocation_variable  # noqa: E402

from clusterfsdp.core import warmlaunch  # noqa: E402


@pytest.fixture
def tiny_job(tmp_path: Path) -> Path:
    """jobs/tiny-cpu.toml with its paths made absolute and runs going under tmp_path."""
    text = (REPO / "jobs" / "tiny-cpu.toml").read_text()
    text = text.replace('run_root = "../runs"', f'run_root = "{tmp_path / "runs"}"')
    text = text.replace('"data/corpus.txt"', f'"{CORPUS}"')
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session", autouse=True)
def _warm_rank_server() -> Iterator[None]:
    """The environment `procs.launch`'s warm rank server imports under is this process's as the
    session starts (the plugins' variables set, no test's yet), with one torch thread. A second
    server, under this process's environment as it is (what a `clusterfsdp` command started by a
    test inherits), is the local executor's warm launcher for the session (`CLUSTERFSDP_LAUNCHER`,
    core/warmlaunch.py): the controllers of the local runs the tests submit are forked by it when
    its rule allows. Both are stopped when the session ends (tests/rankserver.py)."""
    procs.BASE_ENV.clear()
    procs.BASE_ENV.update(procs.base_env())
    procs.BASE_CWD = os.getcwd()
    launcher = None if rankserver.cold_switch(os.environ) else rankserver.controllers(dict(os.environ), procs.BASE_CWD)
    if launcher is not None:
        os.environ[warmlaunch.ENV_LAUNCHER] = launcher.path
    yield
    os.environ.pop(warmlaunch.ENV_LAUNCHER, None)
    rankserver.stop_shared()


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """This process's environment after a test is what it was before: what a test's imports set
    (lm_eval sets HF_XET_HIGH_PERFORMANCE, peft TORCHINDUCTOR_CACHE_DIR, mlflow a telemetry session
    id, sklearn KMP_* at import) is taken back. Left there, every later rank of this xdist worker
    inherits it, differs from the environment the warm rank server imported under, and starts cold
    by rankserver's rule (clean-clone run 22: 30 ranks of test_doctor, test_epochs, ... on the
    workers that had imported one of them, ~5.6 s of CPU each). A library keeps what it read at
    its import; only the environment later processes inherit is restored."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[key]
    for key, value in before.items():
        if key != "PYTEST_CURRENT_TEST" and os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _no_inherited_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests decide themselves whether they run inside an allocation."""
    for key in list(os.environ):
        if allocation_variable(key):
            monkeypatch.delenv(key, raising=False)


# `slurm_cluster` (real daemons); a second user (tests/users.py); per-worker timing (tests/timeline.py)
pytest_plugins = ["slurm_fixtures", "users", "timeline"]


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture (the failed runs test_doctor.py diagnoses,
    test_trackers.py's two attempts, ...): something several tests of its module read."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`.ci/test` runs `--dist loadgroup`), the tests that drive one devcluster
    run on one worker, one after another: run side by side they would wait for each other's nodes.
    With a second cluster (CFDC_TEST_SECOND_PREFIX, tests/slurm_fixtures.py) the tests marked
    `slurm(cluster="b")` are a second group, run beside the first on their own cluster. The tests
    of a module that share a module-scoped fixture go to one worker too:
    loadgroup hands out ungrouped tests one at a time, so a module's tests land on both workers
    and each would build the fixture (launches of real ranks, up to minutes of CPU). Everything
    else spreads over the workers.

    The Slurm tests come first in the collection (each module's order kept): the chain of each
    cluster is the suite's critical path, and with `--no-loadscope-reorder` (.ci/test) xdist hands
    out groups in collection order, so each chain starts on a worker of its own at once (xdist's
    default order, by group size, would start a big module group first and one chain late). Then
    the rest, with the tests that mostly wait spread among them (`_ordered`)."""
    from slurm_fixtures import cluster_prefix  # here: a module-level import would skip its assert rewriting

    for item in items:
        if item.get_closest_marker("slurm"):
            prefix = cluster_prefix(item)
            item.add_marker(pytest.mark.xdist_group(f"slurm-{prefix}" if prefix else "slurm"))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(Path(item.nodeid.split("::")[0]).stem))
    items[:] = _ordered(items)


# The README walk-through, the longest single test: first after the Slurm tests, so that it never
# starts near the end and runs on alone.
FIRST = ("test_readme",)
# Modules whose tests mostly wait (Textual apps driven by a pilot, the watchdog's timed ranks):
# spread evenly through the rest, so that their waits overlap CPU-bound tests. Issue 36's
# timelines: last in collection order (run 38), the last 1.6 minutes used about one core of two;
# all at the start beside the two Slurm chains, which wait too (run 39), minutes 2-5 did.
SPREAD = ("test_tui_app", "test_tui_e2e", "test_tui_snapshots", "test_tui_sweep", "test_tui_serve", "test_watchdog")


def _ordered(items: list[pytest.Item]) -> list[pytest.Item]:
    """The Slurm chains (the docstring above), then `FIRST`, then the rest with the tests of
    `SPREAD` placed evenly among them; each module's order kept."""

    def stem(item: pytest.Item) -> str:
        return Path(item.nodeid.split("::")[0]).stem

    slurm = [i for i in items if i.get_closest_marker("slurm")]
    first = [i for i in items if not i.get_closest_marker("slurm") and stem(i) in FIRST]
    spread = [i for i in items if not i.get_closest_marker("slurm") and stem(i) in SPREAD]
    rest = [i for i in items if not i.get_closest_marker("slurm") and stem(i) not in FIRST + SPREAD]
    keyed = [(j + 0.5, i) for j, i in enumerate(rest)]
    keyed += [((k + 0.5) * len(rest) / max(len(spread), 1), i) for k, i in enumerate(spread)]
    return slurm + first + [i for _, i in sorted(keyed, key=lambda pair: pair[0])]
