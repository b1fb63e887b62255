"""The TUI's key path end to end, with real training on the local executor: compose a job (a
validation error shown, then fixed), save it, submit it, watch it in the queue, read its log,
and resume it from a checkpoint as a new attempt. Only squeue is faked (no Slurm needed)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Select, TabbedContent
from tui_helpers import FakeSlurm, rendered, run_app, settle, until

from clusterfsdp.core import procs, runfolder
from clusterfsdp.core.records import Event
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.compose_screen import ComposeScreen
from clusterfsdp.tui.confirm_screen import ConfirmScreen
from clusterfsdp.tui.field_editor import FieldEditor
from clusterfsdp.tui.logs_screen import LogsScreen
from clusterfsdp.tui.path_screen import PathScreen
from clusterfsdp.tui.queue_rows import QueueRow
from clusterfsdp.tui.resume_screen import ResumeScreen
from clusterfsdp.tui.run_screen import RunScreen

EXPECTED_TOML = """\
[job]
name = "tui-e2e"
run_root = "runs"

[slurm]
tasks_per_node = 1

[train]
steps = 20

[fsdp]
mixed_precision = "fp32"

[checkpoint]
every_steps = 10
"""


def _kill_leftovers(root: Path) -> None:
    """A failed test must not leave training processes behind."""
    for run in runfolder.list_runs(root):
        for attempt in run.attempts:
            if attempt.leader is not None:
                procs.signal_group(attempt.leader, signal.SIGKILL)


def current(app: ClusterApp) -> QueueRow:
    row = app.current_row
    assert row is not None
    return row


def _events(run: runfolder.RunFolder, name: str) -> list[Event]:
    return [e for e in run.events() if e.event == name]


def test_compose_save_submit_queue_logs_resume(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=1.0)
    run: list[runfolder.RunFolder] = []

    async def scenario(pilot):
        # ---- compose: one invalid value, shown under its field, then fixed by typing
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        await settle(pilot)
        for path, value in (
            ("job-name", "tui-e2e"),
            ("job-run_root", "runs"),
            ("slurm-tasks_per_node", "1"),
            ("checkpoint-every_steps", "10"),
        ):
            screen.query_one(f"#f-{path} Input", Input).value = value
        screen.query_one("#f-fsdp-mixed_precision Select", Select).value = "fp32"
        screen.query_one("#executor", Select).value = "local"
        screen.query_one("#sections", TabbedContent).active = "tab-train"
        steps = screen.query_one("#f-train-steps Input", Input)
        steps.focus()
        steps.value = ""
        await pilot.press("2", "O")  # a letter O for a zero
        await settle(pilot)
        editor = screen.query_one("#f-train-steps", FieldEditor)
        assert rendered(editor.query_one(".errors")).strip() == "train.steps: expected integer, found string '2O'"
        await pilot.press("ctrl+g")  # submit is refused while there are problems
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("backspace", "0")
        await settle(pilot)
        assert screen.review is not None and screen.review.errors == [] and not editor.has_class("-invalid")

        # ---- save: the file holds exactly the keys that differ from the defaults
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, PathScreen)
        app.screen.query_one(Input).value = "job.toml"
        await pilot.press("enter")
        await settle(pilot)
        assert (tmp_path / "job.toml").read_text() == EXPECTED_TOML
        assert "(modified)" not in rendered(screen.query_one("#compose-file"))

        # ---- submit on the local executor: the queue shows the run, then its end
        await pilot.press("ctrl+g")
        await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation (after Slurm is asked again)"
        )
        await pilot.press("y")
        await until(pilot, lambda: app.current_key is not None and app.current_row is not None, "the submitted run")
        submitted = current(app).run
        assert submitted is not None
        run.append(submitted)
        assert run[0].path.parent == root / "tui-e2e"
        assert app.screen.query_one(DataTable).get_row_at(0)[0] == run[0].id

        # ---- logs: the run's rank-0 output, followed while it trains
        await pilot.press("3")
        logs = app.screen
        assert isinstance(logs, LogsScreen)
        await until(pilot, lambda: any("step 20/20" in line for line in logs.view.lines), "the last step logged", 180)
        assert "step 20/20" in rendered(logs.view)
        await until(pilot, lambda: current(app).state == "COMPLETED", "COMPLETED in the queue", 60)

        # ---- run: checkpoints of steps 10 and 20; resume from 10 is a new attempt
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        table = screen.query_one("#checkpoints", DataTable)
        await until(pilot, lambda: table.row_count == 2, "two checkpoints")
        assert [table.get_row_at(i)[:2] for i in range(2)] == [["20", "complete"], ["10", "complete"]]
        table.focus()
        await pilot.press("down", "enter")
        assert isinstance(app.screen, ResumeScreen) and app.screen.step == 10
        await pilot.click("#resume")
        await until(pilot, lambda: len(run[0].attempts) == 2, "a second attempt")
        second = run[0].attempts[1]
        assert second.resume_step == 10 and second.executor == "local"
        await until(pilot, lambda: _events(run[0], "completed")[1:], "the resumed attempt's end", 180)
        (resumed,) = _events(run[0], "resumed")
        assert resumed.step == 10 and str(resumed.job_id) == str(second.job_id)
        await until(
            pilot,
            lambda: current(app).attempts == 2 and current(app).state == "COMPLETED",
            "the queue row of the resumed run",
            30,
        )
        await until(
            pilot,
            lambda: ["20", "set aside"] in [table.get_row_at(i)[:2] for i in range(table.row_count)],
            "step 20 set aside, not deleted",
        )

        # ---- logs follow the newest attempt by themselves
        await pilot.press("3")
        await until(
            pilot,
            lambda: logs.file is not None and logs.file.path.parent.name == f"{second.job_id}.0",
            "the new attempt's log",
            30,
        )

    try:
        run_app(app, scenario)
    finally:
        _kill_leftovers(root)
