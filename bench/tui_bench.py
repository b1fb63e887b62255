"""TUI benchmark (not a test): time to first paint, the log view on a 1 GB log, and the run
screen's charts on a long metrics.jsonl.

    python bench/tui_bench.py [--log-gb 1.0] [--runs 200] [--repeat 3] [--metrics-rows 100000] [--tmp /tmp]

1. First paint: `python -m clusterfsdp.tui` started on a pseudo-terminal (what a user's
   terminal is), timed from exec to the first frame that shows the queue screen, and to the
   frame whose table shows the newest of `--runs` run folders (the first refresh, done in a
   worker). Median of `--repeat` starts; the app is quit with ctrl+q each time.
2. Logs, in one process through Textual's headless pilot, on a generated log of `--log-gb`
   GB (written under --tmp and deleted afterwards): time until the end of the file is on
   screen after switching to Logs; until a line appended to the file shows while following;
   until "first error" (e) lands on a traceback half-way through the file; until an upward
   search (?) from the end for a line near the top of the file lands; until scrolling above the
   loaded window shows older lines. The process's RSS before opening the log and after each
   step, and its peak (VmHWM), show the memory stays bounded while the file is 1 GB.
3. Run screen, in one process through the pilot, on a run whose metrics.jsonl has
   `--metrics-rows` training rows (and an eval row every 100 steps): time from pressing 4 to
   the four charts drawn; the time to draw the four charts again (a resize or a new row costs
   this), median of 20; the time for s (smoothing changed: every series recomputed and drawn);
   RSS after.

Prints one JSON object. Numbers depend on the disk's page cache (the file was just written,
so it is mostly cached) and on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import math
import os
import pty
import random
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clusterfsdp.core import runfolder  # noqa: E402
from clusterfsdp.core import spec as specmod  # noqa: E402
from clusterfsdp.core.records import Event, EventKind, Executor  # noqa: E402

LINE = "[rank0] step {i} loss {loss:.4f} lr 3.00e-04 grad_norm 0.912 tokens/s 21,153 mem 0.42 GB {pad}\n"
TRACEBACK = "Traceback (most recent call last):\n"
NEEDLE = "needle-near-the-top-of-the-file\n"


def make_run(root: Path, run_id: str, job_id: str = "1") -> runfolder.RunFolder:
    """A finished local run folder with one attempt (what the queue and logs screens list)."""
    spec = specmod.loads(f'[job]\nname = "bench"\nrun_root = "{root}"\n')
    run = runfolder.create_run(spec, Executor.LOCAL, run_id=run_id)
    run.add_attempt(job_id, Executor.LOCAL, "submit")
    run.append_event(Event(EventKind.COMPLETED, job_id, 0, 0, "bench", time.time(), step=1))
    return run


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB, from /proc."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# ---------------------------------------------------------------- 1. first paint
def first_paint(run_root: Path, newest: str, cwd: Path) -> tuple[float, float]:
    """Seconds from exec to the queue screen's first frame, and to the frame listing `newest`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))  # rows, columns
    os.set_blocking(master, False)
    env = {**os.environ, "TERM": "xterm-256color"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "clusterfsdp.tui", "--run-root", str(run_root), "--refresh", "3600"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    seen, painted, listed = b"", None, None
    try:
        while listed is None:
            assert time.perf_counter() - t0 < 120, f"no frame after 120 s:\n{seen[-2000:]!r}"
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 1 << 16)
                except OSError:
                    break
            if painted is None and b"Queue" in seen:
                painted = time.perf_counter() - t0
            if newest.encode() in seen:
                listed = time.perf_counter() - t0
        for _ in range(30):  # ctrl+q; again if it came before the app read its input (it happens)
            os.write(master, b"\x11")
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert painted is not None and listed is not None
    return painted, listed


# ---------------------------------------------------------------- 2. the log view
def write_log(path: Path, gb: float) -> tuple[int, str]:
    """A log of about `gb` GB: numbered step lines, a needle near the top and a traceback half-way."""
    target = int(gb * (1 << 30))
    path.parent.mkdir(parents=True, exist_ok=True)
    block_lines = 10_000
    written, i = 0, 0
    with open(path, "w") as f:
        while written < target:
            lines = [LINE.format(i=i + k, loss=5 - (i + k) % 1000 / 500, pad="x" * 24) for k in range(block_lines)]
            if i == block_lines * 5:
                lines[0] = NEEDLE
            if written < target // 2 <= written + block_lines * len(lines[1]):
                lines[0], lines[1] = TRACEBACK, "ValueError: the first error in this file\n"
            chunk = "".join(lines)
            f.write(chunk)
            written += len(chunk)
            i += block_lines
    last = LINE.format(i=i - 1, loss=5 - (i - 1) % 1000 / 500, pad="x" * 24).rstrip("\n")
    return path.stat().st_size, last


async def log_view(run_root: Path, log: Path, last: str) -> dict:
    from clusterfsdp.tui.app import ClusterApp
    from clusterfsdp.tui.logs_screen import LogsScreen

    out: dict[str, float] = {}
    app = ClusterApp(run_root, refresh_s=3600)

    async def timed(pilot, action: Callable[[], object], done: Callable[[], bool], what: str) -> float:
        t0 = time.perf_counter()
        result = action()
        if asyncio.iscoroutine(result):
            await result
        while not done():
            assert time.perf_counter() - t0 < 600, f"{what}: no result after 600 s"
            await pilot.pause(0.005)
        return time.perf_counter() - t0

    async with app.run_test(size=(120, 36)) as pilot:
        while app.current_row is None:
            await pilot.pause(0.05)
        out["rss_before_mb"], _ = rss_mb()
        out["open_to_end_s"] = await timed(
            pilot,
            lambda: pilot.press("3"),
            lambda: isinstance(app.screen, LogsScreen) and app.screen.view.lines[-1:] == [last],
            "open",
        )
        logs = app.screen
        assert isinstance(logs, LogsScreen)
        view = logs.view
        out["rss_after_open_mb"], _ = rss_mb()
        out["lines_held"] = len(view.lines)

        def append() -> None:
            with open(log, "a") as f:
                f.write("appended while following\n")

        out["follow_new_line_s"] = await timed(
            pilot, append, lambda: view.lines[-1:] == ["appended while following"], "follow"
        )
        out["first_error_s"] = await timed(
            pilot,
            lambda: pilot.press("e"),
            lambda: view.current is not None and view.lines[view.current] == TRACEBACK.rstrip("\n"),
            "first error",
        )
        out["rss_after_first_error_mb"], _ = rss_mb()
        await pilot.press("G")
        while not (logs.at_tail and view.lines[-1:] == ["appended while following"]):
            await pilot.pause(0.01)

        async def search() -> None:
            await pilot.press("question_mark", *NEEDLE.rstrip("\n"), "enter")

        out["search_up_to_top_s"] = await timed(
            pilot,
            search,
            lambda: view.current is not None and view.lines[view.current] == NEEDLE.rstrip("\n"),
            "search",
        )
        out["rss_after_search_mb"], _ = rss_mb()
        await pilot.press("G")
        while not (logs.at_tail and view.lines[-1:] == ["appended while following"]):
            await pilot.pause(0.01)
        start = view.start
        out["scroll_above_window_s"] = await timed(
            pilot, lambda: pilot.press("home"), lambda: view.start < start, "scroll up"
        )
        out["rss_final_mb"], out["rss_peak_mb"] = rss_mb()
    return out


def write_metrics(run: runfolder.RunFolder, rows: int) -> None:
    """`rows` training rows a step apart (noisy loss, warmup + cosine lr), an eval row every 100."""
    rng = random.Random(0)
    with open(run.metrics_file, "w") as f:
        for step in range(1, rows + 1):
            lr = 3e-4 * min(1.0, step / 1000) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / rows)))
            row = {
                "step": step,
                "loss": 2 + 8 * math.exp(-step / (rows / 10)) + rng.gauss(0, 0.1),
                "lr": lr,
                "grad_norm": 0.4 + abs(rng.gauss(0, 0.1)),
                "tokens_per_s": 20_000 + rng.gauss(0, 300),
                "tokens_per_s_per_gpu": 2_500 + rng.gauss(0, 40),
                "mfu": 0.41,
                "mem_peak_gb": 61.2,
            }
            f.write(json.dumps(row) + "\n")
            if step % 100 == 0:
                f.write(json.dumps({"step": step, "eval_loss": 2.1 + 8 * math.exp(-step / (rows / 10))}) + "\n")


async def run_view(run_root: Path) -> dict:
    from clusterfsdp.tui.app import ClusterApp
    from clusterfsdp.tui.metric_chart import MetricChart
    from clusterfsdp.tui.run_screen import RunScreen

    out: dict[str, float] = {}
    app = ClusterApp(run_root, refresh_s=3600)
    async with app.run_test(size=(120, 36)) as pilot:
        while app.current_row is None:
            await pilot.pause(0.05)
        t0 = time.perf_counter()
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        charts = list(screen.query(MetricChart))
        while not (len(screen.metrics) and all(c.series and c.series[0].xs for c in charts)):
            assert time.perf_counter() - t0 < 600, "no charts after 600 s"
            await pilot.pause(0.005)
        await pilot.pause()
        out["run_open_to_charts_s"] = time.perf_counter() - t0
        out["metric_points"] = len(screen.metrics)
        draws = []
        for _ in range(20):
            t = time.perf_counter()
            for c in charts:
                c.render()
            draws.append(time.perf_counter() - t)
        out["four_charts_draw_ms"] = 1000 * statistics.median(draws)
        t = time.perf_counter()
        before = charts[0].series
        await pilot.press("s")
        while charts[0].series is before:
            await pilot.pause(0.005)
        out["smoothing_change_s"] = time.perf_counter() - t
        out["rss_after_run_view_mb"], _ = rss_mb()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--log-gb", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--metrics-rows", type=int, default=100_000)
    p.add_argument("--tmp", default="/tmp")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tui-bench-", dir=args.tmp))
    try:
        root = work / "runs"
        ids = [f"20260101-{i // 60:02d}{i % 60:02d}00-{i:04x}" for i in range(args.runs)]
        for run_id in ids:
            make_run(root, run_id)
        paints = [first_paint(root, ids[-1], work) for _ in range(args.repeat)]
        result: dict[str, object] = {
            "first_paint_s": round(statistics.median(p for p, _ in paints), 3),
            f"first_rows_{args.runs}_runs_s": round(statistics.median(r for _, r in paints), 3),
            "first_paint_all_s": [round(p, 3) for p, _ in paints],
        }
        shutil.rmtree(root)
        run = make_run(root, "20260102-000000-0000")
        t0 = time.perf_counter()
        size, last = write_log(run.log_path("1", 0, 0), args.log_gb)
        result["log_bytes"] = size
        result["log_write_s"] = round(time.perf_counter() - t0, 1)
        views = asyncio.run(log_view(root, run.log_path("1", 0, 0), last))
        result.update({k: round(v, 3) if isinstance(v, float) else v for k, v in views.items()})
        shutil.rmtree(root)
        run = make_run(root, "20260103-000000-0000")
        write_metrics(run, args.metrics_rows)
        result["metrics_bytes"] = run.metrics_file.stat().st_size
        charts = asyncio.run(run_view(root))
        result.update({k: round(v, 3) if isinstance(v, float) else v for k, v in charts.items()})
        result["cpus"] = os.cpu_count()
        result["load_avg_1m"] = os.getloadavg()[0]
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
