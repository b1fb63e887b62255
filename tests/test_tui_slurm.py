"""The queue against the real multi-node Slurm test cluster: a job submitted with sbatch shows
up (one squeue per refresh), and cancelling it from the TUI really cancels it (squeue and sacct
say so)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from slurm_fixtures import SlurmCluster
from textual.widgets import DataTable
from tui_helpers import run_app, until

from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.confirm_screen import ConfirmScreen


async def refresh_until(pilot, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Refresh the queue (r) until `condition()` holds: Slurm takes a moment to list a new job
    and to drop a cancelled one (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.press("r")
        await until(pilot, lambda: not pilot.app.refreshing, "a refresh")


@pytest.mark.slurm
def test_queue_shows_a_real_job_and_cancel_cancels_it(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.slurm_conf))
    name = f"tui-{uuid.uuid4().hex[:8]}"
    job_id = str(slurm_cluster.sbatch(["-N1", "-t", "5", "-o", "/dev/null", "-J", name, "--wrap", "sleep 600"]))
    key = f"job:{job_id}"
    app = ClusterApp(tmp_path / "runs", refresh_s=3600)  # the real Slurm: squeue, sacct, scancel

    async def scenario(pilot) -> None:
        await until(pilot, lambda: app.refreshed >= 1, "the first refresh")
        await refresh_until(pilot, lambda: key in {r.key for r in app.rows}, "the job in the queue")
        row = next(r for r in app.rows if r.key == key)
        assert row.name == name and row.state in ("PENDING", "RUNNING", "CONFIGURING") and app.slurm_error == ""
        assert app.partitions and app.cluster_error == ""  # the same refresh's sinfo, read by the real parser
        table = app.screen.query_one(DataTable)
        await pilot.pause()
        table.move_cursor(row=table.get_row_index(key))
        await pilot.pause()
        assert app.current_key == key
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: app.activity == "", "the cancel")
        await refresh_until(pilot, lambda: key not in {r.key for r in app.rows}, "the job gone from the queue")

    try:
        run_app(app, scenario)
        assert slurm_cluster.squeue_state(int(job_id)) in ("", "CANCELLED")  # squeue -j lists a job that just ended
        assert slurm_cluster.wait_sacct(int(job_id), "CANCELLED").startswith("CANCELLED")
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
