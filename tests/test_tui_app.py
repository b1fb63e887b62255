"""Each screen and key path of the TUI through Textual's pilot, on run folders with fixed
contents and a fake Slurm (the real end-to-end path is in test_tui_e2e.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, OptionList, Select
from tui_helpers import FakeSlurm, job, make_run, rendered, run_app, settle, until

from clusterfsdp.control.procs import ProcessId
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.compose_screen import ComposeScreen
from clusterfsdp.tui.confirm_screen import ConfirmScreen
from clusterfsdp.tui.field_editor import FieldEditor
from clusterfsdp.tui.help_screen import HelpScreen
from clusterfsdp.tui.logs_screen import LogsScreen
from clusterfsdp.tui.path_screen import PathScreen
from clusterfsdp.tui.resume_screen import ResumeScreen
from clusterfsdp.tui.run_screen import RunScreen


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
        assert y > 0 and key.endswith("20260101-120900-aaaa")
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
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = rendered(app.screen.query_one(".dialog"))
        assert "Refresh" in text and "Cancel job" in text and "squeue" in text
        await pilot.press("escape")
        await pilot.press("1")
        app.screen.query_one("#f-job-name Input").focus()
        await pilot.press("f1")  # works while typing, where ? is a character
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen) and "Submit" in rendered(app.screen.query_one(".dialog"))

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
    run, lines = big_run
    app = ClusterApp(run.path.parents[1], slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_logs_at_the_end(pilot, app, lines[-1])
        await pilot.press("slash")
        assert screen.query_one("#search", Input).has_focus
        await pilot.press(*"step 49990 ", "enter")  # in the loaded window
        await settle(pilot)
        view = screen.view
        assert view.lines[view.current].startswith("[rank0] step 49990 ") and not view.follow
        await pilot.press("slash", *"needle", "enter")  # before the window: found by scanning the file
        await until(pilot, lambda: view.current is not None and view.lines[view.current] == lines[40_000], "needle")
        await pilot.press("e")
        await until(pilot, lambda: view.current is not None and view.lines[view.current] == lines[123], "first error")
        assert view.start == 0
        await pilot.press("n")  # next error upwards: none above the traceback in the window or the file
        await settle(pilot)
        await pilot.press("N")  # the next error below: the ValueError line
        await settle(pilot)
        assert view.lines[view.current] == lines[124]
        assert "Traceback" in rendered(view) and "following" not in rendered(screen.query_one("#log-info"))
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
def test_run_screen_plots_metrics_and_lists_checkpoints(root):
    run = make_run(root, checkpoints=(20, 40), partial=(60,))
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.current_key is not None, "a selected run")
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        await until(pilot, lambda: screen.facts is not None and screen.facts.points is not None, "metrics")
        await pilot.pause()
        plot = rendered(screen.query_one("#loss"))
        assert "⠉" in plot or "⠑" in plot or "⢄" in plot  # braille dots drawn
        assert "5│" in plot and "└10" in plot
        latest = rendered(screen.query_one("#latest"))
        assert "step       40" in latest and "24,000" in latest
        table = screen.query_one("#checkpoints", DataTable)
        assert [table.get_row_at(i)[:2] for i in range(3)] == [
            ["60", "partial (unfinished save)"],
            ["40", "complete"],
            ["20", "complete"],
        ]
        table.focus()
        await pilot.press("enter")  # the partial one: refused
        assert not isinstance(app.screen, ResumeScreen)
        await pilot.press("down", "enter")
        assert isinstance(app.screen, ResumeScreen) and app.screen.step == 40
        await pilot.press("escape")
        with open(run.metrics_file, "a") as f:  # new rows appear without rereading the file
            f.write('{"step": 50, "loss": 1.5, "tokens_per_s": 1.0}\n')
        await until(pilot, lambda: "step       50" in rendered(screen.query_one("#latest")), "the new row", 10)

    run_app(app, scenario)


# ---------------------------------------------------------------- compose
def test_compose_validates_as_you_type_and_jumps_to_problems(root):
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        await settle(pilot)
        assert screen.review.errors == [] and "llama-tiny (random init)" in rendered(screen.query_one("#summary"))
        screen.query_one("#sections").active = "tab-train"
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
        screen.query_one("#sections").active = "tab-job"
        screen.query_one("#side").active = "problems-tab"
        problems = screen.query_one("#problems", OptionList)
        problems.focus()
        await pilot.press("enter")  # jump to the field with the problem
        await pilot.pause()
        assert screen.query_one("#sections").active == "tab-train" and box.has_focus
        await pilot.press("end", "backspace")  # focus selected the text; keep it and drop the x
        await settle(pilot)
        assert screen.review.errors == [] and not editor.has_class("-invalid")
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
