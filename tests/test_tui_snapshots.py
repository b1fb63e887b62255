"""Snapshots (pytest-textual-snapshot) of the main screens at a fixed terminal size.

Content is fixed: run folders written by the test with fixed ids, times and metrics, a fake
Slurm queue, the working directory set to the test's folder (paths show relative to it) and
the clock's time zone set to UTC (checkpoint times). After a deliberate change of the UI,
review the report and rerun with `pytest tests/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import Input
from tui_helpers import SINFO, SIZE, SMALL, FakeSlurm, job, make_run, until

from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.logs_screen import LogsScreen
from clusterfsdp.tui.run_screen import RunScreen


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield tmp_path / "runs"
    monkeypatch.undo()
    time.tzset()


def _app(root: Path, gpus_per_node: int = 0, eval_every: int = 0) -> ClusterApp:
    make_run(
        root,
        "20260101-120000-aaaa",
        executor="slurm",
        job_id="101",
        end=None,
        logged=30,
        checkpoints=(20,),
        partial=(30,),
        gpus_per_node=gpus_per_node,
        eval_every=eval_every,
    )
    make_run(root, "20260101-110000-bbbb", job_id="1001", log_lines=40)
    slurm = FakeSlurm(
        jobs={"101": job("101", "RUNNING", "tiny-cpu"), "202": job("202", "PENDING", "eval", reason="Resources")},
        sinfo=SINFO,
    )
    return ClusterApp(root, slurm=slurm, refresh_s=3600)


async def _drained(pilot) -> None:
    """Every worker done and the screen laid out again (the queue's column widths follow the
    rows on the next idle, so a screenshot taken sooner could catch the old widths)."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


async def _refreshed(pilot) -> None:
    await until(pilot, lambda: pilot.app.refreshed >= 1, "the first refresh")
    await _drained(pilot)


def test_queue_screen(root, snap_compare):
    """Two runs (one running on Slurm, one finished locally) and another user job, pending."""
    assert snap_compare(_app(root), terminal_size=SIZE, run_before=_refreshed)


def test_queue_screen_with_slurm_down(root, snap_compare):
    """Slurm errors are a status line; the run folders still list."""
    make_run(root, "20260101-110000-bbbb")
    app = ClusterApp(root, slurm=FakeSlurm(error="squeue: error: Unable to contact slurm controller"), refresh_s=3600)
    assert snap_compare(app, terminal_size=SIZE, run_before=_refreshed)


def test_compose_screen_with_an_error(root, snap_compare):
    """The train tab with one invalid value: the message under the field, the tab and Problems count."""

    async def run_before(pilot) -> None:
        await pilot.press("1")
        screen = pilot.app.screen
        screen.query_one("#sections").active = "tab-train"
        screen.query_one("#f-train-steps Input", Input).value = "2O"
        await until(pilot, lambda: screen.review is not None and screen.review.errors, "the review")
        await _drained(pilot)

    assert snap_compare(_app(root), terminal_size=SIZE, run_before=run_before)


def test_compose_screen_with_a_list_of_values(root, snap_compare):
    """train.lr turned into a list of values (ctrl+l): the field says so, the summary counts the
    sweep's points and lists what they vary."""

    async def run_before(pilot) -> None:
        await pilot.press("1")
        screen = pilot.app.screen
        screen.query_one("#f-job-run_root Input", Input).value = "/srv/runs"
        screen.query_one("#sections").active = "tab-train"
        screen.query_one("#f-train-lr Input", Input).focus()
        await pilot.press("ctrl+l")
        await until(pilot, lambda: screen.query_one("#f-train-lr .values", Input).has_focus, "the list's input")
        await pilot.press("ctrl+u", *"1e-4, 3e-4", "escape")  # over the value it starts with; no blinking cursor
        await until(pilot, lambda: screen.review is not None and screen.review.sweep, "the sweep's review")
        await _drained(pilot)
        # Where focusing the new input left the form's scroll depends on whether the layout had
        # caught up (a loaded machine showed either): put the field at the top, as a user would see it.
        lr = screen.query_one("#f-train-lr")
        lr.screen.scroll_to_widget(lr, animate=False, top=True)
        await _drained(pilot)

    assert snap_compare(_app(root), terminal_size=SIZE, run_before=run_before)


async def _logs_screen(pilot) -> None:
    await _refreshed(pilot)
    await pilot.press("3")
    screen = pilot.app.screen
    assert isinstance(screen, LogsScreen)
    await until(pilot, lambda: screen.view.lines[-1:] == ["[rank0] line 29: step 29 loss 2.1000"], "the log")
    await _drained(pilot)


def test_logs_screen(root, snap_compare):
    """The newest run's rank-0 log, opened at its end, following."""
    assert snap_compare(_app(root), terminal_size=SIZE, run_before=_logs_screen)


async def _run_screen(pilot) -> None:
    await _refreshed(pilot)
    await pilot.press("4")
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen)
    await until(pilot, lambda: screen.facts is not None and screen.facts.checkpoints, "the run's facts")
    await _drained(pilot)


def test_run_screen(root, snap_compare):
    """A CPU run: loss (raw, dimmed, under its smoothed line), learning rate, gradient norm and
    tokens/s per rank, step, memory, and the checkpoints (one complete, one partial)."""
    assert snap_compare(_app(root), terminal_size=SIZE, run_before=_run_screen)


def test_run_screen_at_80x24(root, snap_compare):
    """A GPU run with eval rows: the eval loss on the loss chart's axes, tokens/s per GPU, all of
    it on an 80×24 terminal."""
    assert snap_compare(_app(root, gpus_per_node=8, eval_every=10), terminal_size=SMALL, run_before=_run_screen)


def test_queue_screen_at_80x24(root, snap_compare):
    """Below 100 columns JOB and TRIES move to the detail lines; REASON stays on screen."""
    assert snap_compare(_app(root), terminal_size=SMALL, run_before=_refreshed)


def test_cluster_screen(root, snap_compare):
    """Partitions from sinfo: idle, mixed, allocated and down nodes, free GPUs and CPUs."""

    async def run_before(pilot) -> None:
        await _refreshed(pilot)
        await pilot.press("5")
        await _drained(pilot)

    assert snap_compare(_app(root), terminal_size=SIZE, run_before=run_before)


def test_logs_screen_at_80x24(root, snap_compare):
    """Every key of the Logs screen in the footer at 80 columns."""
    assert snap_compare(_app(root), terminal_size=SMALL, run_before=_logs_screen)


def test_help_screen(root, snap_compare):
    """? on the queue: what the screen is for and its keys."""

    async def run_before(pilot) -> None:
        await _refreshed(pilot)
        await pilot.press("question_mark")
        await _drained(pilot)

    assert snap_compare(_app(root), terminal_size=SIZE, run_before=run_before)
