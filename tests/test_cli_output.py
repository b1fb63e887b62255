"""The CLI for scripts and for people: `--json` (one versioned shape for runs, status, submit and
resume), `--parsable` job ids, run ids for completion, colour only on a TTY, and bash/zsh
completion scripts run by the real shells."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import on_a_tty

from clusterfsdp.core import fileio, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Event, EventKind, Executor, TrackerIds

BIN = str(Path(sys.executable).parent)  # the venv's `clusterfsdp` script, for completion
STATUS_KEYS = {
    "run_id", "name", "folder", "state", "live", "bad", "reason", "job_id", "executor", "step", "steps", "loss",
    "checkpoints", "attempts", "events", "notes", "trackers", "eval_step", "eval_loss", "eval_ppl",
    "reward_accuracy", "eval_reward_accuracy", "reward_margin", "kl", "created", "epoch", "cost", "cost_error",
    "benchmarks",
}  # fmt: skip


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture
def finished_run(tmp_path: Path) -> runfolder.RunFolder:
    """A run folder as a completed local run leaves it (records written as the worker writes them)."""
    spec = S.loads(f'[job]\nname = "done"\nrun_root = "{tmp_path / "runs"}"\n[train]\nsteps = 20\n')
    run = runfolder.create_run(spec, Executor.LOCAL)
    run.add_attempt("777", Executor.LOCAL, "submit")
    now = time.time()
    run.append_event(Event(EventKind.START, "777", 0, 0, "host", now, world_size=2, nodes=1, attempt=0))
    fileio.append_jsonl(run.metrics_file, {"step": 20, "loss": 2.5, "attempt": 0})
    run.append_event(Event(EventKind.COMPLETED, "777", 0, 0, "host", now + 1, step=20))
    run.write_tracker_ids(TrackerIds(wandb_run_id="abcd1234"))
    return run


def test_runs_and_status_json_share_one_versioned_shape(finished_run, tmp_path):
    root = str(tmp_path / "runs")
    listing = json.loads(cli("runs", "--json", "--run-root", root).stdout)
    assert listing["schema"] == 1 and listing["slurm_error"] == ""
    (row,) = listing["runs"]
    assert set(row) == STATUS_KEYS
    assert row["run_id"] == finished_run.id and row["state"] == "COMPLETED" and row["step"] == 20
    assert row["live"] is False and row["bad"] is False and row["trackers"] == {"wandb_run_id": "abcd1234"}
    assert [a["job_id"] for a in row["attempts"]] == ["777"] and row["attempts"][0]["executor"] == "local"
    assert [(e["event"], e.get("attempt")) for e in row["events"]] == [("start", 0), ("completed", None)]
    r = cli("status", finished_run.id, "--json", "--run-root", root)
    assert r.returncode == 0 and json.loads(r.stdout) == {"schema": 1, **row}
    assert cli("runs", "--quiet", "--run-root", root).stdout.split() == [finished_run.id]


def _strict(text: str):
    def refuse(word: str):
        raise AssertionError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_a_diverged_run_is_strict_json_everywhere(tmp_path):
    """A loss of NaN and a perplexity of inf were written as NaN/Infinity, which is not JSON: jq
    and JavaScript refused the whole `runs --json` of a run root with one diverged run. Such
    numbers are null in `runs`, `status` and `doctor --json`."""
    spec = S.loads(f'[job]\nname = "nan"\nrun_root = "{tmp_path / "runs"}"\n[train]\nsteps = 20\n')
    run = runfolder.create_run(spec, Executor.LOCAL)
    run.add_attempt("778", Executor.LOCAL, "submit")
    run.append_event(Event(EventKind.START, "778", 0, 0, "host", time.time(), world_size=1, nodes=1, attempt=0))
    fileio.append_jsonl(run.metrics_file, {"step": 3, "loss": float("nan"), "attempt": 0})
    fileio.append_jsonl(run.metrics_file, {"step": 3, "eval_loss": float("inf"), "eval_ppl": float("inf")})
    root = str(tmp_path / "runs")
    (row,) = _strict(cli("runs", "--json", "--run-root", root).stdout)["runs"]
    assert row["loss"] is None and row["eval_ppl"] is None and row["step"] == 3, row
    assert _strict(cli("status", run.id, "--json", "--run-root", root).stdout)["loss"] is None
    assert _strict(cli("doctor", run.id, "--json", "--run-root", root).stdout)["schema"] == 1


def test_submit_json_and_parsable_print_what_scripts_need(tmp_path):
    """Through stub `sbatch`/`scontrol` commands (no Slurm here) that answer as Slurm does."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in {
        "scontrol": 'echo "Slurmctld(primary) at head is UP"',
        "sbatch": '[[ " $* " == *" --parsable "* ]] && echo 4242 || echo "Submitted batch job 4242"',
    }.items():
        (bindir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bindir / name).chmod(0o755 | stat.S_IEXEC)
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nrun_root = "{tmp_path / "runs"}"\n')
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    r = cli("submit", str(job), "--parsable", env=env)
    assert r.returncode == 0 and r.stdout == "4242\n", r.stderr
    r = cli("submit", str(job), "--json", env=env)
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1 and doc["job_id"] == "4242" and doc["executor"] == "slurm"
    assert set(doc) == {"schema", "run_id", "name", "folder", "executor", "job_id", "notice", "resume_step", "notes"}
    assert Path(doc["folder"], "state.json").is_file()
    r = cli("submit", str(job), "--json", "--parsable", env=env)
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_colour_only_on_a_tty_and_never_with_no_color(finished_run, tmp_path):
    root = str(tmp_path / "runs")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    assert "\x1b[32mCOMPLETED\x1b[0m" in on_a_tty("runs", "--run-root", root, env=env)
    assert "\x1b[" not in on_a_tty("runs", "--run-root", root, env={**env, "NO_COLOR": "1"})
    assert "\x1b[" not in cli("runs", "--run-root", root, env=env).stdout  # a pipe
    assert "\x1b[31merror:\x1b[0m" in on_a_tty("status", "nope", "--run-root", root, env=env)


def _complete(shell: str, script: str, words: list[str], env: dict[str, str]) -> list[str]:
    """The completions for the command line `words` (the last one being completed), in the real
    shell: bash calls the function as `complete -F` does; zsh through its bashcompinit's `compgen
    -F` (what `_bash_complete` runs), whose candidates zsh then matches against the word itself."""
    line = " ".join(f"'{w}'" for w in words)
    setup = f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}"
    call = '_clusterfsdp; echo "${COMPREPLY[@]}"' if shell == "bash" else f"compgen -F _clusterfsdp -- '{words[-1]}'"
    r = subprocess.run([shell, "-c", f"{setup}\n{call}"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return [c for c in r.stdout.split() if c.startswith(words[-1])]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_complete_commands_options_keys_and_run_ids(shell, finished_run, tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CLUSTERFSDP_RUN_ROOT": str(tmp_path / "runs")}
    script = cli("completion", shell).stdout
    assert _complete(shell, script, ["clusterfsdp", "su"], env) == ["submit"]
    assert _complete(shell, script, ["clusterfsdp", "submit", "--exe"], env) == ["--executor"]
    assert _complete(shell, script, ["clusterfsdp", "submit", "j.toml", "--executor", ""], env) == [
        "auto", "slurm", "local"
    ]  # fmt: skip
    assert _complete(shell, script, ["clusterfsdp", "submit", "--set", "train.l"], env) == [
        "train.lr=", "train.log_every="
    ]  # fmt: skip
    assert _complete(shell, script, ["clusterfsdp", "status", ""], env) == [finished_run.id]
    assert _complete(shell, script, ["clusterfsdp", "logs", "--rank", "1", finished_run.id[:6]], env) == [
        finished_run.id
    ]  # fmt: skip
    registered = "complete -p clusterfsdp" if shell == "bash" else "print -r -- $_comps[clusterfsdp]"
    r = subprocess.run([shell, "-c", f"{script}\n{registered}"], capture_output=True, text=True, timeout=60, env=env)
    assert "-F _clusterfsdp" in r.stdout


def test_runs_json_written_a_run_at_a_time_is_the_same_document(tmp_path):
    from tui_helpers import make_run

    from clusterfsdp.control import jsonout, status

    runs = [make_run(tmp_path, f"20260101-12000{i}-aaaa", checkpoints=(), ranks=1) for i in range(3)]
    rows, _ = status.statuses(runs)
    for chosen in (rows, []):
        users = {"alice": {"gpu_hours": 1.5, "cpu_hours": 3.0, "runs": 2, "unknown": 0}}
        text = "".join(jsonout.listing(chosen, 'a "quoted" error', users))
        whole = {"runs": chosen, "slurm_error": 'a "quoted" error', "cost_by_user": users}
        assert json.loads(text) == json.loads(jsonout.document(whole))


# A window title, a clear screen and a clipboard write (OSC 52), as another user could plant them
# in the names of a shared run root's folders and in a run's records.
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u202e"


def _planted_run(root: Path):
    """A failed run whose job folder, run folder, job id, reasons and log carry escape sequences."""
    from tui_helpers import make_run

    made = make_run(root, end="failed", job_id="1001")
    run = runfolder.RunFolder(root / f"tiny{EVIL}" / f"20260101-120000-{EVIL}")
    run.path.parent.mkdir()
    made.path.rename(run.path)
    made.path.parent.rmdir()
    record = run.record()
    record.attempts[0].job_id, record.attempts[0].reason = f"1001{EVIL}", f"submit{EVIL}\ud800"  # (JSON's "\ud800")
    run.write_record(record)
    run.events_file.write_text("")
    run.append_event(Event(EventKind.START, f"1001{EVIL}", 0, 0, f"node{EVIL}", 1.0))
    run.append_event(Event(EventKind.FAILED, f"1001{EVIL}", 0, 0, f"node{EVIL}", 2.0, reason=f"boom{EVIL}"))
    return run


def test_names_and_reasons_from_a_planted_run_never_reach_the_terminal_raw(tmp_path):
    """Reproduced: a folder name, a job id and a reason with escape sequences set the reader's
    window title, cleared the screen and wrote the clipboard through `runs`, `status`, `doctor`,
    `cancel` and `logs`, and a lone surrogate in a reason (JSON's "\\ud800") ended `status`
    with UnicodeEncodeError. Every command's output (on a terminal, colour on) shows them escaped
    (`\\x1b]0;pwned\\x07`); only the colour codes of the CLI itself are real escapes."""
    root = tmp_path / "runs"
    run = _planted_run(root)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    outputs = {
        "runs": on_a_tty("runs", "--run-root", str(root), env=env),
        "status": on_a_tty("status", str(run.path), env=env),
        "doctor": on_a_tty("doctor", str(run.path), env=env),
        "cancel": on_a_tty("cancel", str(run.path), env=env),
        "logs": on_a_tty("logs", str(run.path), "--rank", "7", env=env),
        "missing": on_a_tty("status", f"nope{EVIL}", "--run-root", str(root), env=env),
    }
    assert "\x1b[31mFAILED\x1b[0m" in outputs["runs"] and "\x1b[31merror:\x1b[0m" in outputs["missing"]
    assert "\\u202e\\ud800" in outputs["status"]  # a lone surrogate: UnicodeEncodeError on a terminal before
    for command, out in outputs.items():
        plain = out.replace("\x1b[31m", "").replace("\x1b[0m", "").replace("\x1b[1m", "")
        assert "\x1b" not in plain and "\x07" not in plain and "\u202e" not in plain, (command, out)
        assert "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07\\u202e" in out, (command, out)
    assert f"20260101-120000-{EVIL}" in cli("runs", "--json", "--run-root", str(root)).stdout.encode().decode(
        "unicode_escape"
    )  # --json: JSON's own escapes, as before


def test_the_tui_queue_shows_a_planted_runs_names_escaped(tmp_path):
    from textual.widgets import DataTable, Static
    from tui_helpers import FakeSlurm, run_app, settle

    from clusterfsdp.tui.app import ClusterApp

    root = tmp_path / "runs"
    run = _planted_run(root)
    app = ClusterApp(root, FakeSlurm())

    async def scenario(pilot):
        await settle(pilot)
        table = app.screen.query_one(DataTable)
        cells = [str(c) for c in table.get_row_at(0)]
        detail = str(app.screen.query_one("#queue-detail", Static).render())
        for text in [*cells, detail]:
            assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, text
        assert cells[0] == run.id.encode("unicode_escape").decode() and "boom\\x1b]0;pwned" in detail

    run_app(app, scenario)


def test_two_runs_of_one_job_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    """Run ids are the second plus 16 random bits: two runs of one job that drew the same id
    (a sweep's fast dry runs) ended the second with FileExistsError. The id is drawn again; a
    run id the caller chose is never reused."""
    spec = S.loads(f'[job]\nname = "twice"\nrun_root = "{tmp_path / "runs"}"\n')
    ids = iter(["20260101-120000-aaaa", "20260101-120000-aaaa", "20260101-120000-bbbb"])
    monkeypatch.setattr(runfolder, "new_run_id", lambda: next(ids))
    first, second = (runfolder.create_run(spec, Executor.LOCAL) for _ in range(2))
    assert (first.id, second.id) == ("20260101-120000-aaaa", "20260101-120000-bbbb")
    assert first.record().created <= second.record().created
    with pytest.raises(FileExistsError):
        runfolder.create_run(spec, Executor.LOCAL, run_id=first.id)
