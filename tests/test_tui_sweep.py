"""The Sweeps screen (key 6), through the real app and its pilot: a sweep folder laid out as
control.sweep leaves it (sweep.json from the real record class, the points' run folders with
metrics), no training. Slurm is the fake one (tests/tui_helpers.py): the sweep is local."""

from __future__ import annotations

from textual.widgets import DataTable
from tui_helpers import T0, FakeSlurm, make_run, run_app, settle, until

from clusterfsdp.control.records import Executor, SweepPoint, SweepRecord
from clusterfsdp.control.sweepfolder import SweepFolder
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.sweep_chart import SweepChart
from clusterfsdp.tui.sweeps_screen import SweepsScreen


def _column(table: DataTable, label: str) -> list[str]:
    at = [str(c.label).split(" ")[0] for c in table.columns.values()].index(label)
    return [str(table.get_row_at(i)[at]) for i in range(table.row_count)]


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
        await pilot.press("6")
        screen = app.screen
        assert isinstance(screen, SweepsScreen)
        await until(pilot, lambda: screen.refreshed, "the sweeps read")
        await pilot.pause()
        sweeps = screen.query_one("#sweeps", DataTable)
        # best: point 0's eval loss 2.8 (5.2 - 2.4) beats every training loss (2.5 is not eval)
        assert [str(c) for c in sweeps.get_row_at(0)] == ["swab", "tiny", "3", "3 COMPLETED", "2.8000"]
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
