"""The Sweeps screen (key 6), through the real app and its pilot: a sweep folder laid out as
control.sweep leaves it (sweep.json from the real record class, the points' run folders with
metrics), no training. Slurm is the fake one (tests/tui_helpers.py): the sweep is local."""

from __future__ import annotations

import tomllib
from pathlib import Path

from textual.widgets import DataTable, Input, Select, TabbedContent
from tui_helpers import (
    T0,
    FakeSlurm,
    dialog_text,
    make_run,
    open_in_compose,
    rendered,
    run_app,
    scored_sweep,
    settle,
    until,
)

from clusterfsdp.control.sweep import Sweep
from clusterfsdp.control.sweepfolder import SweepFolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor, SweepPoint, SweepRecord
from clusterfsdp.tui import actions
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.compose_screen import ComposeScreen
from clusterfsdp.tui.confirm_screen import ConfirmScreen
from clusterfsdp.tui.field_editor import FieldEditor
from clusterfsdp.tui.sweep_chart import SweepChart
from clusterfsdp.tui.sweeps_screen import SweepsScreen


def _column(table: DataTable, label: str) -> list[str]:
    at = [str(c.label).split(" ")[0] for c in table.columns.values()].index(label)
    return [str(table.get_row_at(i)[at]) for i in range(table.row_count)]


async def _open_sweeps(pilot) -> SweepsScreen:
    """The Sweeps screen (key 6), once it has read the sweeps."""
    await pilot.press("6")
    screen = pilot.app.screen
    assert isinstance(screen, SweepsScreen)
    await until(pilot, lambda: screen.refreshed, "the sweeps read")
    await pilot.pause()
    return screen


def test_sweeps_screen_lists_sorts_charts_and_selects_points(tmp_path):
    """Three points (lr 3e-3, 1e-3, 2e-3) that logged 40, 20 and 30 of 40 steps, the first with
    eval losses: the sweep's line, the points in each sort order s cycles through, one curve per
    shown point (space hides one), and Enter makes a point's run the current run."""
    root = tmp_path / "runs"
    points = [SweepPoint(i, f"ab-p{i}", {"train.lr": lr}) for i, lr in enumerate((3e-3, 1e-3, 2e-3))]
    for p, logged in zip(points, (40, 20, 30), strict=True):
        make_run(root, p.run_id, name="tiny-swab", logged=logged, log_lines=0, checkpoints=(),
                 eval_every=10 if p.index == 0 else 0)  # fmt: skip
    sweep = SweepFolder(root / "tiny-swab")
    sweep.write_record(SweepRecord("swab", "tiny", Executor.LOCAL, T0, ["train.lr"], points, max_parallel=1))
    older = SweepFolder(root / "tiny-swaa")  # listed second (ids newest first)
    make_run(root, "aa-p0", name="tiny-swaa", end=None, log_lines=0, checkpoints=())
    older.write_record(
        SweepRecord("swaa", "tiny", Executor.LOCAL, T0, ["train.seed"], [SweepPoint(0, "aa-p0", {"train.seed": 7})])
    )
    app = ClusterApp(root, FakeSlurm(), refresh_s=60)

    async def scenario(pilot):
        screen = await _open_sweeps(pilot)
        sweeps = screen.query_one("#sweeps", DataTable)
        # best: point 0's eval loss 2.8 (5.2 - 2.4) beats every training loss (2.5 is not eval)
        assert [str(c) for c in sweeps.get_row_at(0)] == ["swab", "tiny", "3", "3 COMPLETED", "2.8000 (point 0)"]
        table = screen.query_one("#sweep-points", DataTable)
        assert _column(table, "RUN") == ["ab-p0", "ab-p1", "ab-p2"]
        assert _column(table, "train.lr") == ["0.003", "0.001", "0.002"]
        assert _column(table, "LOSS") == ["2.5000", "3.7500", "3.1250"]
        orders = {}
        for _ in range(5):  # state, step, loss, eval_loss, train.lr
            await pilot.press("s")
            orders[screen.sort] = _column(table, "POINT")
        assert orders == {"state": ["0", "1", "2"], "step": ["1", "2", "0"], "loss": ["0", "2", "1"],
                          "eval_loss": ["0", "1", "2"], "train.lr": ["1", "2", "0"]}  # fmt: skip
        chart = screen.query_one(SweepChart)
        assert sorted(s.tag for s in chart.series) == ["p0", "p0", "p1", "p2"]  # point 0: loss and eval loss
        table.focus()
        await pilot.press("space")  # the first row: point 1 (sorted by lr)
        assert sorted({s.tag for s in chart.series}) == ["p0", "p2"]
        assert _column(table, "SHOWN") == ["", "●", "●"]
        await pilot.press("enter")
        assert app.current_key == str(sweep.path / "ab-p1")

        sweeps.focus()  # the other sweep: its points, and it stays selected across a refresh
        await pilot.press("down")
        for _ in range(2):
            done = screen.refreshed
            await pilot.press("r")
            await until(pilot, lambda done=done: screen.refreshed > done, "a refresh")
            await settle(pilot)
            await settle(pilot)
            assert screen.refreshed == done + 1  # rebuilding the table selected nothing, so read nothing
            assert screen.selected == str(older.path) and _column(table, "train.seed") == ["7"]
            assert [s.tag for s in chart.series] == ["p0"]

    run_app(app, scenario)


def test_sweeps_screen_shows_and_sorts_by_each_points_newest_benchmark_scores(tmp_path):
    """tui_helpers.scored_sweep (point 0 acc 0.5, point 1 acc 0.75, point 2 no result): a column
    per score (no standard errors) with each point's newest value, and s reaches the scores,
    which sort best first (word_perplexity: lowest), the unscored point last."""
    root = tmp_path / "runs"
    scored_sweep(root)
    app = ClusterApp(root, FakeSlurm(), refresh_s=60)

    async def scenario(pilot):
        screen = await _open_sweeps(pilot)
        table = screen.query_one("#sweep-points", DataTable)
        assert _column(table, "mc/acc") == ["0.5000", "0.7500", "-"]
        assert _column(table, "mc/word_perplexity") == ["12.0000", "20.0000", "-"]
        orders = {}
        for _ in range(8):  # state, step, loss, eval_loss, train.lr, then the two scores, then index
            await pilot.press("s")
            orders[screen.sort] = _column(table, "POINT")
        assert orders["bench/mc/acc"] == ["1", "0", "2"] and orders["bench/mc/word_perplexity"] == ["0", "1", "2"]
        assert screen.sort == "index" and "bench/mc/acc_stderr" not in orders

    run_app(app, scenario)


def test_compose_turns_a_field_into_a_list_of_values_and_submits_a_sweep(tmp_path, monkeypatch):
    """Compose, ctrl+l on train.lr: its list of values is checked as `clusterfsdp sweep` checks it
    (a value of the wrong type is an error under the field, naming the key, and nothing is made),
    the summary counts the points; a point the sweep service refuses at submit is named under the
    field at fault; then submitting makes the sweep (the real sweep service, local executor; its
    driver, which trains the points, is not started here: test_sweep.py runs it), which the Sweeps
    screen shows. job.name cannot be a list (said why); train.lr turned back into one value
    submits a plain run with that value."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    (tmp_path / "a-file").write_text("")
    drivers: list[Path] = []
    monkeypatch.setattr(Sweep, "_start_driver", lambda self: drivers.append(self.path))
    runs: list[S.JobSpec] = []
    monkeypatch.setattr(actions, "submit", lambda spec, executor: runs.append(spec) or _stop())
    app = ClusterApp(root, FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        run_root = screen.query_one("#f-job-run_root Input", Input)
        run_root.value = str(tmp_path / "a-file")  # checked at submit, as a run's is
        screen.query_one("#executor", Select).value = "local"
        screen.query_one("#f-job-name Input", Input).focus()
        await pilot.press("ctrl+l")
        assert not screen.query_one("#f-job-name", FieldEditor).listed
        assert any("a sweep cannot vary job.name" in str(n.message) for n in app._notifications)

        screen.query_one("#sections", TabbedContent).active = "tab-train"
        lr = screen.query_one("#f-train-lr", FieldEditor)
        lr.query_one(".value", Input).focus()
        await pilot.press("ctrl+l")
        values = lr.query_one(".values", Input)
        await until(pilot, lambda: values.has_focus, "the list's input")
        assert lr.listed and values.value == "0.0003"  # the single value, to add to
        await pilot.press(*", fast")
        wrong = "sweep.grid train.lr: expected number, found string 'fast'"
        await until(pilot, lambda: rendered(lr.query_one(".errors")).strip() == wrong, "the wrong type")
        await pilot.press("ctrl+g")  # refused: nothing is made
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen) and not root.exists()

        await pilot.press(*["backspace"] * 4, *"1e-4")
        await until(pilot, lambda: "train.lr = 0.0003, 0.0001" in rendered(screen.query_one("#summary")), "the grid")
        assert "sweep      2 points" in rendered(screen.query_one("#summary"))
        await pilot.press("ctrl+g")
        assert "sweep      2 points" in await dialog_text(pilot, ConfirmScreen, "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: screen.review is not None and screen.review.errors, "the refusal")
        screen.query_one("#sections", TabbedContent).active = "tab-job"
        await pilot.pause()
        at_fault = "".join(rendered(screen.query_one("#f-job-run_root .errors")).split())  # wrapped, also mid-path
        want = f"point 0 (train.lr=0.0003): job.run_root: {tmp_path / 'a-file'} is a file, not a folder"
        assert at_fault == "".join(want.split())
        assert not drivers and not root.exists()
        run_root.value = str(root)
        await until(pilot, lambda: screen.review is not None and not screen.review.errors, "the review of the fix")
        await pilot.press("ctrl+g")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SweepsScreen) and app.screen.refreshed, "the Sweeps screen")
        sweeps = app.screen
        assert isinstance(sweeps, SweepsScreen)
        await until(pilot, lambda: sweeps.current is not None and sweeps.current.record is not None, "the sweep")
        (folder,) = [SweepFolder(p) for p in drivers]
        assert sweeps.selected == str(folder.path)
        record = folder.record()
        assert record.executor is Executor.LOCAL and record.keys == ["train.lr"]
        assert [p.values for p in record.points] == [{"train.lr": 3e-4}, {"train.lr": 1e-4}]
        assert [folder.run_folder(p).spec().train.lr for p in record.points] == [3e-4, 1e-4]
        assert _column(sweeps.query_one("#sweep-points", DataTable), "train.lr") == ["0.0003", "0.0001"]

        await pilot.press("1")  # back to one value: a plain run of the value it had
        lr.focus_editor()
        await pilot.press("ctrl+l")
        await until(pilot, lambda: screen.summary is not None and screen.summary.sweep is None, "one value")
        assert not lr.listed and lr.query_one(".value", Input).has_focus
        assert "sweep" not in rendered(screen.query_one("#summary"))
        await pilot.press("ctrl+g")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: runs, "the plain submit")
        assert runs[0].train.lr == 3e-4 and len(drivers) == 1

    run_app(app, scenario)


def test_compose_opens_a_sweeps_job_file_with_its_lists_and_saves_them_back(tmp_path, monkeypatch):
    """A job file with a [sweep] table (as `clusterfsdp sweep` reads it): its grid's keys open as
    lists of values, the rest of the table is kept, the file is not "modified" by opening it, and
    saving after a change writes the grid back."""
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.toml"
    job.write_text('[train]\nlr = 0.0001\n\n[sweep]\nmax_parallel = 1\n\n[sweep.grid]\n"train.lr" = [0.0001, 0.0003]\n')
    app = ClusterApp(tmp_path / "runs", FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        screen = await open_in_compose(pilot, app, job)
        lr = screen.query_one("#f-train-lr", FieldEditor)
        assert lr.listed and lr.values_text == "0.0001, 0.0003"
        assert "sweep      2 points" in rendered(screen.query_one("#summary"))
        assert "(modified)" not in rendered(screen.query_one("#compose-file"))
        lr.query_one(".values", Input).value = "0.0001, 0.0003, 0.001"
        await until(pilot, lambda: "sweep      3 points" in rendered(screen.query_one("#summary")), "three points")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert tomllib.loads(job.read_text()) == {
            "train": {"lr": 0.0001},
            "sweep": {"max_parallel": 1, "grid": {"train.lr": [0.0001, 0.0003, 0.001]}},
        }

    run_app(app, scenario)


def _stop():
    raise RuntimeError("stop here: a plain run is test_tui_e2e.py's")
