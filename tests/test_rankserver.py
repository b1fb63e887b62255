"""The tests' warm rank server (tests/rankserver.py, issue 36): ranks it forks end, report and
print as Popen's would, its fallback when a fork is unsafe still starts them, it decides cold
where a variable read at import differs, and it ends with the test process that started it.

The servers here preload nothing (the stand-in rank, tests/served_rank.py, imports only the
standard library); the one `procs.launch` shares per pytest process preloads torch and
transformers with the same code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import procs
import pytest
import rankserver
from procs import BASE_ENV, make_run, tiny_job_toml
from rankserver import RankServer

TESTS = Path(__file__).parent
ARGV = [sys.executable, "-m", "served_rank"]
SCRIPT = [sys.executable, str(TESTS / "served_rank.py")]  # how the fault-injecting workers are started
SWITCHES = (rankserver.ENV_TEST_COLD, "CLUSTERFSDP_COLD_START")  # these tests check the server under either
# Without PYTHONUNBUFFERED: a cold rank's stdout is block-buffered, and the forked one's must be too.
ENV = {
    **{k: v for k, v in BASE_ENV.items() if k not in ("PYTHONUNBUFFERED", *SWITCHES)},
    "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]),
    "HF_HUB_OFFLINE": "1",  # as the server preloads (the worker's default; served_rank does not set it)
}


@pytest.fixture(autouse=True)
def _warm_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    for switch in SWITCHES:
        monkeypatch.delenv(switch, raising=False)


def _start_three(start, started: list | None = None) -> list[tuple[int, str]]:
    """Ranks 0-2 of served_rank; rank 2 is sent SIGTERM once it waits. Exit status and output of
    each (the rank objects appended to `started`)."""
    ranks = [start({**ENV, "RANK": str(r)}) for r in range(3)]
    (started if started is not None else []).extend(ranks)
    said = "".join(ranks[2].stdout.readline() for _ in range(3))  # the report, a line on stderr, "waiting"
    assert said.startswith("REPORT ") and said.endswith("\nrank 2 on stderr\nwaiting\n"), said
    with pytest.raises(subprocess.TimeoutExpired):
        ranks[2].wait(timeout=0.2)
    assert ranks[2].poll() is None and ranks[2].returncode is None
    ranks[2].send_signal(signal.SIGTERM)
    return [(p.wait(timeout=60), (said if p is ranks[2] else "") + p.stdout.read()) for p in ranks]


def _report(text: str) -> dict:
    return json.loads(next(line for line in text.splitlines() if line.startswith("REPORT "))[7:])


@pytest.fixture(scope="module")
def server():
    server = RankServer(ENV, os.getcwd(), modules=())
    assert server.ready(120), server.said()
    yield server
    server.stop()


@pytest.mark.parametrize("argv", [ARGV, SCRIPT], ids=["module", "script"])
def test_a_served_rank_is_forked_and_ends_as_a_cold_one(server, argv):
    """Exit statuses (0, 1, -15 after SIGTERM), stdout and stderr on one pipe, wait's timeout, and
    the rank itself (argv, cmdline, sys.path[0]: the cwd or the script's folder, stdio buffering)
    as a fresh interpreter's, for `python -m MODULE` and `python SCRIPT.py`; its parent is the server."""
    started: list = []
    served = _start_three(lambda env: server.start(argv, env), started)
    assert [p.forked for p in started] == [True] * 3
    cold = _start_three(
        lambda env: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    )
    assert [code for code, _ in served] == [code for code, _ in cold] == [0, 1, -signal.SIGTERM]
    for (_, warm_out), (_, cold_out) in zip(served, cold, strict=True):
        warm, fresh = _report(warm_out), _report(cold_out)
        assert warm.pop("ppid") == server.pid and fresh.pop("ppid") == os.getpid()
        assert warm.pop("pid") != fresh.pop("pid")
        assert warm == fresh, (warm, fresh)
        assert f"rank {warm['rank']} on stderr" in warm_out
    assert "served_rank" in served[0][1] and served[0][1].count("REPORT ") == 1


def test_a_rank_the_server_cannot_fork_starts_cold_from_it(tmp_path):
    """warmstart's fallback: a second thread in the server makes every fork unsafe, so the server
    starts each rank with Popen; the test sees the same statuses and output."""
    threaded = RankServer(ENV, os.getcwd(), modules=(), thread=True)
    try:
        assert threaded.ready(120), threaded.said()
        started: list = []
        ranks = _start_three(lambda env: threaded.start(ARGV, env), started)
        assert [p.forked for p in started] == [False] * 3
        assert [code for code, _ in ranks] == [0, 1, -signal.SIGTERM]
        assert {_report(out)["ppid"] for _, out in ranks} == {threaded.pid}
    finally:
        threaded.stop()


def test_a_rank_starts_cold_where_forking_would_differ(server, tmp_path):
    """Only the per-rank variables may differ; a variable read at import (HF_HOME), set in the
    test's environment or in the job's [env] (also of a script that runs the worker on a run
    folder), starts the rank cold, as do `-c` and the switch."""
    run = make_run(tiny_job_toml("served", 0, 1), tmp_path)
    worker = [sys.executable, "-m", "clusterfsdp.worker", str(run.path)]
    per_rank = {**ENV, "RANK": "1", "MASTER_PORT": "29999", "CLUSTERFSDP_JOB_ID": "x", "PYTEST_CURRENT_TEST": "t"}
    assert server.cold_reason(ARGV, ENV) == ""
    assert "HF_HUB_OFFLINE" in server.cold_reason(ARGV, {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"})
    assert server.cold_reason(worker, per_rank) == ""
    assert "HF_HOME" in server.cold_reason(worker, {**per_rank, "HF_HOME": str(tmp_path)})
    faulty = [sys.executable, str(TESTS / "faulty_worker.py"), str(run.path)]
    assert server.cold_reason(faulty, {**per_rank, "CLUSTERFSDP_TEST_FAULT": "kill@2:1"}) == ""
    assert "HF_HOME" in server.cold_reason(faulty, {**per_rank, "HF_HOME": str(tmp_path)})
    code = [sys.executable, "-c", "pass"]
    assert server.cold_reason(code, per_rank) == "not `python -m MODULE` or a script"
    assert server.cold_reason(worker, {**per_rank, "CLUSTERFSDP_TEST_COLD": "1"}) == "CLUSTERFSDP_TEST_COLD=1"
    with_env = make_run(tiny_job_toml("served", 0, 1, tail=f'[env]\nHF_HOME = "{tmp_path}"\n'), tmp_path / "b")
    assert "HF_HOME" in server.cold_reason([*worker[:3], str(with_env.path)], per_rank)
    assert "HF_HOME" in server.cold_reason([*faulty[:2], str(with_env.path)], per_rank)


def test_launch_forks_unless_a_variable_read_at_import_differs(server, monkeypatch):
    """`rankserver.start` (what procs.launch calls) with this module's server as the shared one:
    the same environment forks from the server, another HF_HOME starts cold from this process."""
    monkeypatch.setattr(rankserver, "_shared", server)
    same = rankserver.start(ARGV, {**ENV, "RANK": "0"}, ENV, os.getcwd())
    other = rankserver.start(ARGV, {**ENV, "RANK": "0", "HF_HOME": str(TESTS / "none")}, ENV, os.getcwd())
    out = [(p.wait(timeout=60), p.stdout.read() if p.stdout else "") for p in (same, other)]
    assert [code for code, _ in out] == [0, 0]
    assert isinstance(same, rankserver.ServedRank) and same.forked and _report(out[0][1])["ppid"] == server.pid
    assert isinstance(other, subprocess.Popen) and _report(out[1][1])["ppid"] == os.getpid()


def test_the_server_ends_with_the_process_that_started_it():
    """A test process that dies without stopping its server (os._exit: no atexit) leaves no server behind."""
    code = (
        f"import os, sys; sys.path.insert(0, {str(TESTS)!r}); import rankserver; "
        "s = rankserver.RankServer(dict(os.environ), os.getcwd(), modules=()); "
        "assert s.ready(120), s.said(); print(s.pid, flush=True); os._exit(0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    stat = Path(f"/proc/{int(done.stdout)}/stat")
    deadline = time.monotonic() + 60
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_this_sessions_worker_ranks_may_fork(tmp_path):
    """A worker rank as `procs.launch` makes it in this session passes the rule against what the
    shared server is started with (procs.BASE_ENV and BASE_CWD, taken as the session starts): taken
    when conftest imported procs, they lacked a variable a plugin sets later
    (pytest-textual-snapshot's TEXTUAL_SNAPSHOT_TEMPDIR) and every rank of the suite started cold."""
    run = make_run(tiny_job_toml("session", 0, 1), tmp_path)
    argv = [sys.executable, "-m", "clusterfsdp.worker", str(run.path)]
    env = procs.rank_env(1, 2, 29500, "t1")
    base = {k: v for k, v in procs.BASE_ENV.items() if k not in SWITCHES}
    assert rankserver.cold_reason(argv, env, base, procs.BASE_CWD, rankserver.umask()) == ""


def test_a_python_c_rank_of_launch_is_forked_from_a_script_file(monkeypatch):
    """`procs.launch(["-c", CODE, ARG], n)` (test_hf_families', test_lora's and test_preference's
    multi-rank checks) runs CODE from a file (`procs.snippet_script`), which the session's server
    forks (a `-c` rank would start cold: 5-7 s of imports each); its arguments and output are the
    ones `-c` gives, the one argument a job's text rather than a run folder."""
    monkeypatch.delenv(rankserver.ENV_TEST_COLD, raising=False)
    monkeypatch.delenv("CLUSTERFSDP_COLD_START", raising=False)
    code = "import json, os, sys; print('RESULT ' + json.dumps([sys.argv[1:], os.environ['RANK']]))"
    ranks = procs.launch(["-c", code, '[model]\npreset = "llama-tiny"\n'], 2)
    out = procs.wait(ranks, timeout=120)
    assert [code for code, _ in out] == [0, 0], out
    said = [json.loads(text.split("RESULT ", 1)[1].splitlines()[0]) for _, text in out]
    assert said == [[['[model]\npreset = "llama-tiny"\n'], str(r)] for r in range(2)]
    assert all(isinstance(r, rankserver.ServedRank) and r.forked for r in ranks), [type(r) for r in ranks]


def test_ranks_with_tracker_settings_or_inductors_cache_fork_from_what_the_server_preloaded(monkeypatch, tmp_path):
    """A rank with the trackers' settings (test_trackers', test_benchmarks': WANDB_MODE, ...) or
    its own inductor cache (`procs.inductor_env`) forks from the session's server. What it finds
    there (it reports it): none of the modules that read the trackers' settings at import, no
    preloaded module whose source names a tracker setting or a variable a notebook kernel sets
    (`KERNEL_VARIABLES`, which a served notebook supervisor may have otherwise) but the ones that
    read them later (`CALL_TIME_READERS`), the compile-thread
    count `inductor_env` gives, and transformers' checkpoint conversion table built
    (warmstart.fill_caches: the product's preload builds it once, not each rank)."""
    monkeypatch.delenv(rankserver.ENV_TEST_COLD, raising=False)
    monkeypatch.delenv("CLUSTERFSDP_COLD_START", raising=False)
    exact, prefixes = sorted(rankserver.KERNEL_VARIABLES), (*rankserver.KERNEL_PREFIXES, *rankserver.TRACKER_SETTINGS)
    quoted = "[\"']({}|({})\\w*)[\"']".format("|".join(exact), "|".join(prefixes))  # a variable's name in quotes
    tracker_modules = rankserver.TRACKER_MODULES
    code = f"""
import json, re, sys, torch._inductor.config as c, transformers.conversion_mapping as m
readers = [n for n in sys.modules if n.split('.')[0] in {tracker_modules!r} or n in {tracker_modules!r}]
files = {{getattr(mod, "__file__", None) or "" for mod in list(sys.modules.values())}}
pattern = re.compile({quoted!r})
naming = sorted(f for f in files if "site-packages" in f and f.endswith(".py") and pattern.search(open(f).read()))
print("RESULT " + json.dumps([readers, naming, "transformers.modeling_utils" in sys.modules, c.compile_threads,
                              m._checkpoint_conversion_mapping_cache is not None]))
"""
    extra = {"WANDB_MODE": "offline", "MLFLOW_ALLOW_FILE_STORE": "true", **procs.inductor_env(tmp_path / "cache")}
    (rank,) = procs.launch(["-c", code], 1, extra_env=extra)
    text = rank.stdout.read() if rank.stdout else ""
    assert rank.wait(timeout=120) == 0 and isinstance(rank, rankserver.ServedRank) and rank.forked, text
    readers, naming, *rest = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    assert readers == [] and rest == [True, 1, True], text[-3000:]
    assert [f for f in naming if not f.endswith(tuple(rankserver.CALL_TIME_READERS))] == [], naming


# Two tests, in this order on one worker: what a test leaves in os.environ (as an import's side
# effect does) is gone when the next one starts (conftest's `_environment_restored`).
@pytest.mark.xdist_group("environment_restored")
def test_a_variable_a_test_leaves_in_the_environment_is_set_here():
    os.environ["CLUSTERFSDP_TEST_LEFT_SET"] = "1"  # (not monkeypatch: as lm_eval's import sets its variable)
    assert os.environ["CLUSTERFSDP_TEST_LEFT_SET"] == "1"


@pytest.mark.xdist_group("environment_restored")
def test_a_variable_a_test_leaves_in_the_environment_is_gone_in_the_next_one():
    assert "CLUSTERFSDP_TEST_LEFT_SET" not in os.environ
