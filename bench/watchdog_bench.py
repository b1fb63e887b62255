"""What the hang and straggler watchdog costs a rank's training thread, as a fraction of a step
(issue 27: < 1%). CPU only, one process, the real classes:

- per step, the training thread calls `Heartbeat.fetched()` and `Heartbeat.step()`: timed over
  many calls, with the side thread running;
- every BEAT_S seconds the side thread writes the heartbeat file (temp + rename): timed, and
  counted against the training thread in full (as if it held the interpreter all that time);
- the node watchdog is another process (one read of every rank's heartbeat per poll): its CPU
  time per poll is printed for a given world size, not charged to the ranks.

    python bench/watchdog_bench.py [--step-s 0.1] [--ranks 64] [--dir /tmp]

`--step-s` is the step time the cost is compared with: 0.1 s is the tiny CPU job on the
devcluster, far shorter than any real GPU step, so the ratio is an upper bound.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from clusterfsdp.core import health
from clusterfsdp.core.health import Beat, Phase, WatchdogSettings
from clusterfsdp.worker.heartbeat import Heartbeat


def per_step_s(beat: Heartbeat, calls: int) -> float:
    t0 = time.perf_counter()
    for i in range(calls):
        beat.fetched()
        beat.step(i)
    return (time.perf_counter() - t0) / calls


def write_s(beat: Heartbeat, writes: int) -> float:
    t0 = time.perf_counter()
    for _ in range(writes):
        beat._write()
    return (time.perf_counter() - t0) / writes


def poll_s(folder: Path, ranks: int, polls: int) -> float:
    now = time.time()
    for r in range(ranks):
        marks = [[s, now, now] for s in range(8)]
        health.write_beat(folder, Beat(r, "node", 1, "b", 0, Phase.STEP, 8, now, now, 0.1, 0.1, marks))
    settings = WatchdogSettings()
    t0 = time.process_time()
    for _ in range(polls):
        beats = health.read_beats(folder)
        health.find_hang(beats, ranks, settings, time.time())
        health.stragglers(beats, settings)
    return (time.process_time() - t0) / polls


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run = Path(tmp)
        beat = Heartbeat(run, "b", 0, 0, WatchdogSettings())
        beat.phase(Phase.STEP)
        step = per_step_s(beat, 200_000)
        write = write_s(beat, 2_000)
        beat.close()
        (run / "poll").mkdir()
        poll = poll_s(run / "poll", args.ranks, 50)
    thread_share = write / health.BEAT_S  # of the training thread's time, at worst
    ratio = step / args.step_s + thread_share
    print(
        "RESULT "
        + json.dumps(
            {
                "step_calls_us": round(step * 1e6, 3),
                "beat_write_us": round(write * 1e6, 1),
                "beat_every_s": health.BEAT_S,
                "step_s": args.step_s,
                "cost_of_step_time": f"{100 * ratio:.4f}%",
                "watchdog_poll_cpu_ms": round(poll * 1e3, 2),
                "ranks": args.ranks,
                "poll_every_s": max(health.BEAT_S, args.ranks / 200),
            }
        )
    )


if __name__ == "__main__":
    main()
