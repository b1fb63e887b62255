"""Each screen and key path of the TUI through Textual's pilot, on run folders with fixed
contents and a fake Slurm (the real end-to-end path is in test_tui_e2e.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from textual.widgets import DataTable, Footer, Input, OptionList, Select, TabbedContent
from tui_helpers import (
    SINFO,
    SMALL,
    FakeSlurm,
    dialog_text,
    job,
    make_run,
    open_run_screen,
    rendered,
    run_app,
    select,
    settle,
    until,
    write_bench,
)

from clusterfsdp.core import slurmcli
from clusterfsdp.core.presets import PRESETS
from clusterfsdp.core.procs import ProcessId
from clusterfsdp.tui import actions
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.cluster_screen import ClusterScreen
from clusterfsdp.tui.compose_screen import ComposeScreen
from clusterfsdp.tui.confirm_screen import ConfirmScreen
from clusterfsdp.tui.field_editor import FieldEditor
from clusterfsdp.tui.help_screen import HelpScreen
from clusterfsdp.tui.log_view import LogView
from clusterfsdp.tui.logs_screen import LogsScreen
from clusterfsdp.tui.metric_chart import MetricChart
from clusterfsdp.tui.metrics_tail import EMPTY
from clusterfsdp.tui.path_screen import PathScreen
from clusterfsdp.tui.queue_rows import SlurmCommands
from clusterfsdp.tui.resume_screen import ResumeScreen


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


# ---------------------------------------------------------------- queue
def test_queue_shows_runs_and_other_jobs_and_refreshes_on_r(root):
    make_run(root, "20260101-120000-aaaa", executor="slurm", job_id="101", end=None)
    make_run(root, "20260101-110000-bbbb")
    slurm = FakeSlurm(jobs={"101": job("101", "RUNNING", "tiny-cpu"), "202": job("202", "PENDING", "eval")})
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == [
            "20260101-120000-aaaa",
            "20260101-110000-bbbb",
            "-",
        ]
        assert [str(table.get_row_at(i)[2]) for i in range(3)] == ["RUNNING", "COMPLETED", "PENDING"]
        assert app.current_key == str(root.resolve() / "tiny-cpu" / "20260101-120000-aaaa")
        slurm.jobs["101"] = job("101", "COMPLETING", "tiny-cpu")
        await pilot.press("r")
        await until(pilot, lambda: app.refreshed == 2, "refresh on r")
        await pilot.pause()
        assert str(table.get_row_at(0)[2]) == "COMPLETING" and slurm.calls["squeue"] == 2

    run_app(app, scenario)


def test_queue_shows_what_runs_cost_and_why_and_until_when_a_run_waits(root):
    """Issue 39 in the Queue: a COST column (GPU-hours from Slurm's accounting, asked once for all
    runs and not again once the figures settled: the run folder keeps them), and a waiting run's
    reason in words with Slurm's start estimate in its detail lines."""
    from clusterfsdp.control import cost

    done = make_run(root, "20260101-110000-bbbb", executor="slurm", job_id="300")
    waiting = make_run(root, "20260101-120000-aaaa", executor="slurm", job_id="301", end=None)
    waiting.events_file.write_text("")  # queued, never started
    used = {"300": cost.Accounted((cost.Usage(2 * 1800.0, 4 * 1800.0),), "COMPLETED")}
    slurm = FakeSlurm(jobs={"301": job("301", "PENDING", "tiny-cpu", "Resources")}, used=used,
                      starts={"301": "2026-11-28 01:00:00"})  # fmt: skip
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        header = [str(c.label) for c in table.columns.values()]
        costs = [str(table.get_row_at(i)[header.index("COST")]) for i in range(2)]
        assert costs == ["0", "1.00 GPU-h"], costs
        detail = rendered(app.screen.query_one("#queue-detail"))  # the waiting run is selected first
        said = "expected to start 2026-11-28 01:00:00 (Slurm's estimate) · Resources: the nodes it needs are busy"
        assert said in detail, detail
        table.move_cursor(row=1)
        await pilot.pause()
        assert "cost 1.00 GPU-h, 2.00 CPU-h" in rendered(app.screen.query_one("#queue-detail"))
        await pilot.press("r")
        await until(pilot, lambda: app.refreshed == 2, "refresh on r")
        assert slurm.calls["sacct-usage"] == 1 and (done.path / cost.CACHE_FILE).is_file()

    run_app(app, scenario)


def test_refreshes_never_overlap(root):
    make_run(root)
    slurm = FakeSlurm(delay=0.3)
    app = ClusterApp(root, slurm=slurm, refresh_s=0.05)  # the timer fires far more often than squeue answers

    async def scenario(pilot):
        for _ in range(5):
            await pilot.press("r")
        await until(pilot, lambda: slurm.calls["squeue"] >= 4, "several refreshes")
        assert slurm.max_in_flight == 1

    run_app(app, scenario)


def test_selection_and_scroll_survive_refreshes(root):
    for i in range(40):
        make_run(root, f"20260101-12{i:02d}00-aaaa")
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        table = app.screen.query_one(DataTable)
        table.focus()
        for _ in range(30):
            await pilot.press("down")
        await pilot.pause()
        key, y = app.current_key, table.scroll_y
        screen_row = table.cursor_row - y
        assert y > 0 and key is not None and key.endswith("20260101-120900-aaaa")
        await pilot.press("r")  # same rows: cells update in place
        await until(pilot, lambda: app.refreshed == 2, "second refresh")
        assert (app.current_key, table.scroll_y) == (key, y)
        make_run(root, "20260101-130000-new0")  # a new run on top: the selected row stays where it was on screen
        await pilot.press("r")
        await until(pilot, lambda: app.refreshed == 3, "third refresh")
        await pilot.pause()
        assert app.current_key == key and table.cursor_row == 31 and table.cursor_row - table.scroll_y == screen_row

    run_app(app, scenario, size=(120, 24))


def test_slurm_errors_are_a_status_line_not_a_crash(root):
    make_run(root)
    app = ClusterApp(
        root, slurm=FakeSlurm(error="squeue: command not found (is Slurm installed on this machine?)"), refresh_s=3600
    )

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.pause()
        status = rendered(app.screen.query_one(".status-line"))
        assert "Slurm: squeue: command not found" in status
        assert str(app.screen.query_one(DataTable).get_row_at(0)[2]) == "COMPLETED"

    run_app(app, scenario)


def test_cancel_asks_first_and_cancels_a_slurm_job(root):
    slurm = FakeSlurm(jobs={"202": job("202", "RUNNING", "eval")})
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert slurm.cancelled == [] and not isinstance(app.screen, ConfirmScreen)
        await pilot.press("c", "y")
        await until(pilot, lambda: app.refreshed == 2, "refresh after cancel")
        assert slurm.cancelled == ["202"] and app.rows == []

    run_app(app, scenario)


def test_remove_asks_first_deletes_a_finished_run_and_refuses_a_live_one(root):
    """`x` is `clusterfsdp rm` from the queue: a finished run's folder goes after a yes; a live
    run stays, with the run service's refusal as the notification."""
    done = make_run(root)
    live = make_run(root, "20260101-130000-live", end=None)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for the worker processes
    live.update_attempt("1001", leader=ProcessId.of(proc.pid))
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1 and len(app.rows) == 2, "both runs")
        await select(pilot, app, next(r.key for r in app.rows if r.run and r.run.path == done.path))
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert done.path.exists()
        await pilot.press("x", "y")
        await until(pilot, lambda: app.refreshed >= 2 and len(app.rows) == 1, "the refresh after removing")
        assert not done.path.exists()
        await select(pilot, app, app.rows[0].key)
        await pilot.press("x", "y")
        await until(pilot, lambda: app.refreshed >= 3 and app.activity == "", "the refused remove")
        assert live.path.exists() and len(app.rows) == 1
        assert any("remove failed" in str(n.message) and "live attempt" in str(n.message) for n in app._notifications)

    try:
        run_app(app, scenario)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def test_cancel_stops_a_local_run(root):
    run = make_run(root, end=None)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for the worker processes
    run.update_attempt("1001", leader=ProcessId.of(proc.pid))
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1 and app.rows[0].state == "RUNNING", "the running run")
        await pilot.press("c", "y")
        await until(pilot, lambda: app.refreshed >= 2 and app.rows[0].state == "CANCELLED", "cancelled state")

    try:
        run_app(app, scenario)
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_help_lists_the_screens_keys(root):
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("question_mark")
        text = await dialog_text(pilot, HelpScreen, "the help")
        assert "Refresh" in text and "Cancel" in text and "squeue" in text
        await pilot.press("escape")
        await pilot.press("1")
        app.screen.query_one("#f-job-name Input").focus()
        await pilot.press("f1")  # works while typing, where ? is a character
        assert "Submit" in await dialog_text(pilot, HelpScreen, "the compose form's help")

    run_app(app, scenario)


# ---------------------------------------------------------------- logs
@pytest.fixture
def big_run(root):
    """A run whose rank-0 log is ~3 MB (more than the 1 MB the view loads) with a traceback early on."""
    run = make_run(root, log_lines=0)
    lines = [f"[rank0] step {i} loss {i % 97 / 10:.2f} filler {'x' * 40}" for i in range(50_000)]
    lines[123] = "Traceback (most recent call last):"
    lines[124] = "ValueError: the first error"
    lines[40_000] = "needle far from the end"
    run.log_path("1001", 0, 0).write_text("\n".join(lines) + "\n")
    run.log_path("1001", 0, 1).write_text("[rank1] only line\n")
    return run, lines


async def open_logs_at_the_end(pilot, app: ClusterApp, last: str) -> LogsScreen:
    """Select the run, open its logs (key 3) and wait until the file's last line is loaded."""
    await until(pilot, lambda: app.current_key is not None, "a selected run")
    await pilot.press("3")
    screen = app.screen
    assert isinstance(screen, LogsScreen)
    await until(pilot, lambda: screen.view.lines[-1:] == [last], "the last line")
    return screen


def at(view: LogView) -> str:
    """The line the last search or jump landed on."""
    assert view.current is not None
    return view.lines[view.current]


def test_logs_open_at_the_end_follow_new_bytes_and_stay_bounded(big_run):
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        assert len(screen.view.lines) < 30_000 and screen.view.start > 0  # only the end was read
        await until(pilot, lambda: lines[-1] in rendered(screen.view), "the last line on screen")  # renders later
        with open(run.log_path("1001", 0, 0), "a") as f:
            f.write("fresh line\npartial")
        await until(pilot, lambda: screen.view.lines[-2:] == ["fresh line", "partial"], "appended lines")
        with open(run.log_path("1001", 0, 0), "a") as f:
            f.write(" completed\n")
        await until(pilot, lambda: screen.view.lines[-1] == "partial completed", "the completed line")
        assert screen.view.lines.count("fresh line") == 1
        assert "fresh line" in rendered(screen.view)

    run_app(app, scenario)


def test_logs_search_first_error_and_back_to_the_end(big_run):
    """/ searches down and ? up, as in less and vim; n repeats the last search's direction, N goes
    the other way, and a search that finds nothing before the end goes on from the other end."""
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        await pilot.press("slash")
        assert screen.query_one("#search", Input).has_focus
        await pilot.press(*"step 49990 ", "enter")  # on screen, below its top line
        await settle(pilot)
        view = screen.view
        assert at(view).startswith("[rank0] step 49990 ") and not view.follow
        await pilot.press("slash", *"needle", "enter")  # nothing below: wraps to the top of the file
        await until(pilot, lambda: view.current is not None and at(view) == lines[40_000], "needle")
        await pilot.press("e")
        await until(pilot, lambda: view.current is not None and at(view) == lines[123], "first error")
        assert view.start == 0
        await pilot.press("n")  # the next error down: the ValueError line
        await settle(pilot)
        assert at(view) == lines[124]
        await pilot.press("N")  # back up: the traceback
        await settle(pilot)
        assert at(view) == lines[123]
        await pilot.press("question_mark")  # ? searches up, here where / is a key and not help
        assert screen.query_one("#search", Input).has_focus and not isinstance(app.screen, HelpScreen)
        await pilot.press(*"step 7 ", "enter")
        await settle(pilot)
        assert at(view).startswith("[rank0] step 7 ")
        await pilot.press("question_mark", "ctrl+a", "ctrl+k", *"needle", "enter")  # none above: wraps to the end
        await until(pilot, lambda: view.current is not None and at(view) == lines[40_000], "wrapped")
        await pilot.press("G")
        await until(pilot, lambda: view.follow and view.lines[-1] == lines[-1] and screen.at_tail, "the end")

    run_app(app, scenario)


def test_logs_scrolling_up_reads_the_previous_piece(big_run):
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        start = screen.view.start
        await pilot.press("home")
        await until(pilot, lambda: screen.view.start < start, "an earlier piece")
        assert not screen.view.follow and screen.view.scroll_y > 0  # the same lines stay on screen

    run_app(app, scenario)


def test_logs_pick_rank_and_follow_a_new_attempt(big_run):
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: screen.view.lines == ["[rank1] only line"], "rank 1")
        assert screen.query_one("#rank", Select).value == 1
        new = run.log_path("2002", 0, 1)
        new.parent.mkdir(parents=True)
        new.write_text("[rank1] resumed attempt\n")  # a resume: the newest attempt's log takes over
        await until(pilot, lambda: screen.view.lines == ["[rank1] resumed attempt"], "the new attempt", timeout=10)
        attempt = screen.query_one("#attempt", Select)
        attempt.value = "1001.0"
        await until(pilot, lambda: screen.view.lines == ["[rank1] only line"], "the chosen old attempt")

    run_app(app, scenario)


# ---------------------------------------------------------------- run
def test_run_screen_charts_metrics_and_lists_checkpoints(root):
    run = make_run(root, checkpoints=(20, 40), partial=(60,), eval_every=20)
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_run_screen(pilot, app)
        # (the newest pass's facts carry only new rows: the screen keeps what it charted)
        await until(pilot, lambda: screen.facts is not None and screen.metrics is not EMPTY, "metrics")
        await settle(pilot)
        loss = screen.query_one("#loss", MetricChart)
        plot = rendered(loss)
        assert "loss 2.5000  eval 2.8000" in plot  # the title: latest loss and eval loss
        assert "⠉" in plot or "⠑" in plot or "⢄" in plot  # braille dots drawn
        assert "┤" in plot and "└10" in plot and "40" in plot  # y ticks, x from the first logged step
        assert [s.tag for s in loss.series] == ["raw", "main", "eval"]
        assert "lr 3.00e-04" in rendered(screen.query_one("#lr")) and "grad norm 0.500" in rendered(
            screen.query_one("#grad_norm")
        )
        assert "tokens/s 24,000  12,000 per rank" in rendered(screen.query_one("#tokens_per_s"))  # a CPU job
        header = rendered(screen.query_one("#run-header"))
        assert "step 40/40" in header and "peak memory 0.42 GB per rank" in header and "smoothing 0.6" in header
        await pilot.press("s", "s", "s")  # 0.6 -> 0.9 -> 0.99 -> 0: no smoothing, the raw line only
        await settle(pilot)
        assert screen.smoothing == 0.0 and [s.tag for s in loss.series] == ["main", "eval"]
        assert "smoothing 0 (s)" in rendered(screen.query_one("#run-header"))
        table = screen.query_one("#checkpoints", DataTable)
        assert table.has_focus  # enter resumes from the selected checkpoint
        assert [table.get_row_at(i)[:2] for i in range(3)] == [
            ["60", "unfinished save"],
            ["40", "complete"],
            ["20", "complete"],
        ]
        await pilot.press("enter")  # the partial one: refused
        assert not isinstance(app.screen, ResumeScreen)
        await pilot.press("down", "enter")
        assert isinstance(app.screen, ResumeScreen) and app.screen.step == 40
        await pilot.press("escape")
        await pilot.press("z")  # the loss chart fills the screen; z again puts it back
        assert screen.maximized is loss
        await pilot.press("z")
        assert screen.maximized is None
        with open(run.metrics_file, "a") as f:  # new rows appear without rereading the file
            f.write('{"step": 50, "loss": 1.5, "tokens_per_s": 1.0}\n')
        await until(pilot, lambda: "step 50/40" in rendered(screen.query_one("#run-header")), "the new row", 10)
        await until(pilot, lambda: "loss 1.5000" in rendered(loss), "the new row in the loss chart", 10)

    run_app(app, scenario)


def test_run_screen_charts_benchmark_scores_beside_the_loss_as_they_land(root):
    """A run with one benchmark result (step 20): the chart beside the loss plots its scores,
    titled with the latest; a second result written while the screen is open (as an evaluation
    job lands it) is charted without leaving the screen."""
    run = make_run(root)
    write_bench(run, 20, {"bench/mc/acc": 0.5, "bench/mc/acc_stderr": 0.2})
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_run_screen(pilot, app)
        chart = screen.query_one("#lr", MetricChart)
        await until(pilot, lambda: "mc/acc 0.5  lr 3.00e-04" in rendered(chart), "the first result charted")
        assert [(s.tag, list(s.xs)) for s in chart.series] == [("main", [20])]
        write_bench(run, 40, {"bench/mc/acc": 0.75, "bench/mc/acc_stderr": 0.2})
        await until(pilot, lambda: "mc/acc 0.75  lr" in rendered(chart), "the new result charted", 30)
        assert [(s.tag, list(s.xs), list(s.ys)) for s in chart.series] == [("main", [20, 40], [0.5, 0.75])]
        assert "⠉" in rendered(chart) or "⠑" in rendered(chart) or "⢄" in rendered(chart)  # the line drawn

    run_app(app, scenario)


def test_resume_dialog_keeps_what_was_typed_after_a_bad_override(root, monkeypatch):
    """A bad override is shown in the dialog, which stays open with everything typed; and a
    resume the service refuses reopens (R) with what was typed."""
    make_run(root)
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)
    asked: list[tuple] = []

    def refuse(run, step, overrides, executor):
        asked.append((step, overrides, executor))
        raise RuntimeError("the queue is full")

    monkeypatch.setattr(actions, "resume", refuse)

    async def scenario(pilot):
        screen = await open_run_screen(pilot, app)
        await until(pilot, lambda: screen.facts is not None and screen.facts.checkpoints, "checkpoints")
        await pilot.press("enter")
        dialog = app.screen
        assert isinstance(dialog, ResumeScreen) and dialog.step == 40
        dialog.query_one("#nodes", Input).value = "2"
        overrides = dialog.query_one("#overrides", Input)
        overrides.value = "train.stepz=5 train.lr=1e-3"
        dialog.query_one("#executor", Select).value = "local"
        await pilot.press("enter")
        await until(pilot, lambda: "train.stepz" in rendered(dialog.query_one("#resume-error")), "the error")
        assert app.screen is dialog and overrides.value == "train.stepz=5 train.lr=1e-3"
        assert dialog.query_one("#nodes", Input).value == "2" and asked == []
        overrides.value = "train.lr=1e-3"
        await pilot.press("enter")
        await until(pilot, lambda: asked, "the resume")
        assert asked == [(40, ["train.lr=1e-3", "slurm.nodes=2"], "local")]
        await until(pilot, lambda: app.activity == "", "the refusal")
        await pilot.press("R")
        again = app.screen
        assert isinstance(again, ResumeScreen) and again is not dialog
        assert again.query_one("#overrides", Input).value == "train.lr=1e-3"
        assert again.query_one("#nodes", Input).value == "2" and again.query_one("#executor", Select).value == "local"

    run_app(app, scenario)


# ---------------------------------------------------------------- cluster
def test_cluster_screen_lists_partitions_and_puts_one_into_compose(root):
    slurm = FakeSlurm(sinfo=SINFO)
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        assert slurm.calls["squeue"] == slurm.calls["sinfo"] == 1  # one call each per refresh
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        await pilot.pause()
        table = screen.query_one(DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows == [
            ["gpu*", "2-00:00:00", "2/8", "1", "4", "1", "21/64", "160/512"],
            ["cpu", "1-00:00:00", "6/6", "0", "0", "0", "-", "384/384"],
            ["debug (down)", "30:00", "2/2", "0", "0", "0", "-", "16/16"],
        ]
        detail = rendered(screen.query_one("#cluster-detail"))
        assert "GPUs: 21 of 64 free (h100; 8 per node at most)" in detail
        await pilot.press("p")
        compose = app.screen
        assert isinstance(compose, ComposeScreen)
        assert compose.query_one("#f-slurm-partition Input", Input).value == "gpu"
        compose.query_one("#f-slurm-gpus_per_node Input", Input).value = "16"
        compose.query_one("#executor", Select).value = "slurm"
        await settle(pilot)
        assert compose.summary is not None
        assert (
            "partition  gpu: 2 of 8 nodes idle, 21 of 64 GPUs free -- but no node has 16 GPUs" in compose.summary.text
        )

    run_app(app, scenario)


def test_cluster_screen_says_why_it_is_empty_when_slurm_is_down(root):
    slurm = FakeSlurm(error="squeue: error: Unable to contact slurm controller")
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.press("5")
        await pilot.pause()
        detail = rendered(app.screen.query_one("#cluster-detail"))
        assert "Slurm does not answer" in detail and slurm.calls["sinfo"] == 0

    run_app(app, scenario)


# ---------------------------------------------------------------- compose
def test_compose_validates_as_you_type_and_jumps_to_problems(root):
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        await settle(pilot)
        assert screen.review is not None and screen.review.errors == []
        assert "llama-tiny (random init)" in rendered(screen.query_one("#summary"))
        screen.query_one("#sections", TabbedContent).active = "tab-train"
        box = screen.query_one("#f-train-lr Input", Input)
        box.focus()
        box.value = ""
        await pilot.press(*"3e-4x")
        await settle(pilot)
        editor = screen.query_one("#f-train-lr", FieldEditor)
        assert editor.has_class("-invalid")
        assert rendered(editor.query_one(".errors")).strip() == "train.lr: expected number, found string '3e-4x'"
        assert "train ✗1" in rendered(screen.query_one("#sections Tabs"))
        await pilot.press("ctrl+s")  # refused while invalid
        assert not isinstance(app.screen, PathScreen)
        screen.query_one("#sections", TabbedContent).active = "tab-job"
        screen.query_one("#side", TabbedContent).active = "problems-tab"
        problems = screen.query_one("#problems", OptionList)
        problems.focus()
        await pilot.press("enter")  # jump to the field with the problem
        await pilot.pause()
        assert screen.query_one("#sections", TabbedContent).active == "tab-train" and box.has_focus
        await pilot.press("end", "backspace")  # focus selected the text; keep it and drop the x
        await settle(pilot)
        assert screen.review is not None and screen.review.errors == [] and not editor.has_class("-invalid")
        assert screen.review.values["train.lr"] == 3e-4

    run_app(app, scenario)


def test_compose_new_job_saves_only_changed_keys(root, tmp_path):
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        screen.query_one("#f-job-name Input", Input).value = "mine"
        screen.query_one("#f-fsdp-sharding Select", Select).value = "full"
        screen.query_one("#f-slurm-setup Input", Input).value = '["module load cuda"]'
        await settle(pilot)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, PathScreen)
        app.screen.query_one(Input).value = "new.toml"
        await pilot.press("enter")
        await settle(pilot)
        assert (tmp_path / "new.toml").read_text() == (
            '[job]\nname = "mine"\n\n[slurm]\nsetup = [\n    "module load cuda",\n]\n\n[fsdp]\nsharding = "full"\n'
        )
        assert "new.toml" in rendered(screen.query_one("#compose-file"))

    run_app(app, scenario)


def test_queue_e_opens_a_runs_job_as_a_new_file(root):
    make_run(root)
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.current_key is not None, "a selected run")
        await pilot.press("e")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, ComposeScreen) and screen.path is None
        assert screen.query_one("#f-train-steps Input", Input).value == "40"
        assert "copy of run 20260101-120000-aaaa" in rendered(screen.query_one("#compose-file"))

    run_app(app, scenario)


def test_compose_tab_goes_from_the_section_tabs_to_the_first_field(root):
    """Tab never stops on a scroll container (focus nowhere to see, typed text lost)."""
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        await settle(pilot)
        screen.query_one("#sections Tabs").focus()
        name = screen.query_one("#f-job-name Input", Input)
        await pilot.press("tab")
        assert app.focused is name
        await pilot.press("end", *"-2")
        assert name.value == "job-2"  # what was typed arrived
        for _ in range(5):  # the next stops too are controls one can see and use
            await pilot.press("tab")
            assert type(app.focused).__name__ in {"Input", "Select", "Switch", "Button", "ContentTabs", "SelectCurrent"}

    run_app(app, scenario)


def test_compose_preset_is_a_choice_of_the_presets(root, tmp_path):
    (tmp_path / "odd.toml").write_text('[model]\npreset = "llama-huge"\n')
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        select = screen.query_one("#f-model-preset Select", Select)
        assert [value for _, value in select._options] == list(PRESETS)
        select.value = "llama-small"
        await settle(pilot)
        assert screen.review is not None and screen.review.values["model.preset"] == "llama-small"
        assert "llama-small" in rendered(screen.query_one("#summary"))
        screen.open_file(tmp_path / "odd.toml")  # a value outside the table shows, with validate's message
        await settle(pilot)
        await settle(pilot)
        assert select.value == "llama-huge" and ("llama-huge (invalid)", "llama-huge") in select._options
        assert screen.review is not None
        assert any(e.startswith("model.preset: unknown preset 'llama-huge'") for e in screen.review.errors)

    run_app(app, scenario)


def test_compose_save_offers_to_create_a_missing_folder(root, tmp_path):
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        screen.query_one("#f-job-name Input", Input).value = "mine"
        await settle(pilot)
        for answer in ("n", "y"):
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, PathScreen)
            app.screen.query_one(Input).value = "jobs/new/job.toml"
            await pilot.press("enter")
            assert "jobs/new does not exist" in await dialog_text(pilot, ConfirmScreen, "the question")
            await pilot.press(answer)
            await settle(pilot)
            assert (tmp_path / "jobs" / "new").is_dir() == (answer == "y")
        assert (tmp_path / "jobs/new/job.toml").read_text() == '[job]\nname = "mine"\n'
        assert screen.path == Path("jobs/new/job.toml") and "(modified)" not in rendered(
            screen.query_one("#compose-file")
        )

    run_app(app, scenario)


def test_compose_submit_asks_slurm_again_and_submits_what_it_showed(root, monkeypatch):
    """The summary's executor came from the probe at start-up; at submit Slurm is asked again,
    the dialog shows the answer of now, and that executor (not "auto") is what is submitted."""
    slurm = FakeSlurm(available=True)
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)
    submitted: list[str] = []

    def record(spec, executor):
        submitted.append(executor)
        raise RuntimeError("stop here")

    monkeypatch.setattr(actions, "submit", record)

    async def scenario(pilot):
        await until(pilot, lambda: app.slurm_available is True, "the start-up probe")
        await pilot.press("1")
        screen = app.screen
        await settle(pilot)
        assert "runs on    Slurm" in rendered(screen.query_one("#summary"))
        slurm.set_available(False)  # the controller went away after start-up
        probes = slurm.calls["available"]
        await pilot.press("ctrl+g")
        question = await dialog_text(pilot, ConfirmScreen, "the confirmation")
        assert slurm.calls["available"] == probes + 1
        assert "answer changed" in question and "runs on    this machine (local executor)" in question
        await pilot.press("y")
        await until(pilot, lambda: submitted, "the submit")
        assert submitted == ["local"]
        await settle(pilot)
        assert "runs on    this machine" in rendered(screen.query_one("#summary"))  # the summary follows

    run_app(app, scenario)


# ---------------------------------------------------------------- rough edges at 80x24, help, status
def test_help_shows_bracket_keys_as_typed(big_run):
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await open_logs_at_the_end(pilot, app, lines[-1])
        await pilot.press("f1")
        text = await dialog_text(pilot, HelpScreen, "the help")
        assert re.search(r"\s\[  Previous rank", text) and re.search(r"\s\]  Next rank", text)
        assert "[[/]" not in text and "[]/]" not in text
        assert re.search(r"\s\?  Search up", text) and re.search(r"\sF1  this help", text)  # ? is a key here

    run_app(app, scenario, size=(100, 50))


def test_logs_footer_shows_every_key_at_80_columns(big_run):
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        footer = screen.query_one(Footer)
        keys = ("f Follow", "/ ? Search", "n N Match", "e First error", "g G Top/end", "[ ] Rank", "f1 Help")
        await until(pilot, lambda: all(k in rendered(footer) for k in keys), f"{keys} in {rendered(footer)!r}")

    run_app(app, scenario, size=SMALL)


def test_queue_at_80x24_keeps_the_reason_on_screen(root):
    make_run(root, "20260101-120000-aaaa", executor="slurm", job_id="101", end=None)
    long = "Resources, partition gpu, 1:02 elapsed, waiting behind 40 jobs"
    slurm = FakeSlurm(jobs={"101": job("101", "RUNNING", "tiny-cpu"), "202": job("202", "PENDING", "eval", long)})
    app = ClusterApp(root, slurm=slurm, refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        text = rendered(table)
        header, pending = text.splitlines()[0], text.splitlines()[2]
        assert header.split() == ["RUN", "NAME", "STATE", "STEP", "LOSS", "REASON"]  # JOB, TRIES: in the detail
        assert "PENDING" in pending and pending.rstrip().endswith("…") and "Resources, partit" in pending
        assert table.virtual_size.width <= table.scrollable_content_region.width  # nothing off the right edge
        table.move_cursor(row=1)
        await pilot.pause()
        detail = rendered(app.screen.query_one("#queue-detail"))
        assert "slurm:202 · 1 attempt" in detail and "waiting behind 40 jobs" in detail

    run_app(app, scenario, size=SMALL)


def test_status_line_names_the_failing_command_once(root, tmp_path, monkeypatch):
    """Through the real SlurmCommands class: a squeue that cannot reach its controller (a stand-in on
    PATH prints squeue's own message) is one status line, "Slurm: squeue: error: ...", and no
    sinfo is tried. Retries are off (their message is slurmcli's, tested there): an unreachable
    controller is otherwise waited for up to QUERY_RETRY_S."""
    monkeypatch.setenv(slurmcli.ENV_RETRY_S, "0")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, message in (
        ("squeue", "squeue: error: Unable to contact slurm controller (connect failure)"),
        ("sinfo", "sinfo: should not be called"),
    ):
        (bindir / name).write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    make_run(root)
    app = ClusterApp(root, slurm=SlurmCommands(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.refreshed == 1, "first refresh")
        await pilot.pause()
        status = rendered(app.screen.query_one(".status-line"))
        assert "Slurm: squeue: error: Unable to contact slurm controller" in status
        assert "squeue: squeue" not in status and app.cluster_error == "" and app.partitions is None

    run_app(app, scenario)
