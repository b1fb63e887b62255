"""Warm rank start (worker/warmstart.py, issue 36): a rank forked from a launcher that imported
the heavy modules once is what a cold-started one (Popen of `python -u -m ...`) is.

One launcher process (a real `Launcher`, preloading numpy here instead of torch and transformers,
which the end-to-end tests preload: test_e2e_local.py, test_notebook.py) installs handlers as the
local controller and the notebook's supervisor do, opens a file after its imports, then starts
tests/warm_probe.py once per ending, cold and forked, and prints what each child reported, its
output and its exit status as the launcher's `poll()` saw it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import make_run, tiny_job_toml

TESTS = Path(__file__).parent
ENDINGS = ("ok", "ok", "exit3", "error", "interrupt", "kill")

LAUNCHER = """
import json, os, signal, subprocess, sys
from clusterfsdp.worker import warmstart

def main():
    signal.signal(signal.SIGTERM, lambda *a: None)  # as submitit's controller does
    signal.signal(signal.SIGUSR2, lambda *a: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the notebook's supervisor does
    launchers = {"cold": warmstart.Launcher(), "warm": warmstart.Launcher()}
    print("NOTE " + launchers["warm"].preload(None, modules=("numpy",)), flush=True)
    os.environ[warmstart.ENV_COLD] = "1"
    print("OFF " + warmstart.Launcher().preload(None, modules=("numpy",)), flush=True)
    del os.environ[warmstart.ENV_COLD]
    extra = open(os.devnull)  # opened after the imports: never a rank's
    out = {}
    for mode, launcher in launchers.items():
        for k, how in enumerate(sys.argv[1:]):
            env = {**os.environ, "SUBMITIT_LOCAL_LOCALID": str(k)}
            argv = [sys.executable, "-u", "-m", "warm_probe", how]
            p = launcher.start(argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            text = p.stdout.read().decode()
            out.setdefault(mode, []).append({"type": type(p).__name__, "code": p.wait(timeout=60), "out": text})
    print("RESULT " + json.dumps(out), flush=True)
    extra.close()

sys.exit(warmstart.run_main(main))
"""


@pytest.fixture(scope="module")
def started() -> dict:
    # (the local controller runs without -u: its stdout is buffered, the ranks' must not be)
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERFSDP_COLD_START", "PYTHONUNBUFFERED")}
    r = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *ENDINGS], capture_output=True, text=True, cwd=TESTS, env=env, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("NOTE ", "OFF ", "RESULT ")))
    return {"note": lines["NOTE"], "off": lines["OFF"], **json.loads(lines["RESULT"])}


def _report(child: dict) -> dict:
    return json.loads(next(line for line in child["out"].splitlines() if line.startswith("REPORT "))[7:])


def test_ranks_are_forked_once_the_launcher_preloaded(started):
    assert started["note"].startswith("warm start: imports done in"), started["note"]
    assert {c["type"] for c in started["cold"]} == {"Popen"}
    assert {c["type"] for c in started["warm"]} == {"Forked"}  # every ending forked from the warm launcher
    assert started["off"] == "cold start: CLUSTERFSDP_COLD_START=1"  # the switch a user turns it off with


def test_a_forked_rank_starts_as_a_cold_one(started):
    """The same environment, signal dispositions (the launcher's handlers gone, its ignored SIGINT
    kept as exec keeps it), blocked signals, open fds (not the file opened after the imports),
    stdio as `python -u` makes it, argv and `__main__`."""
    for cold, warm in zip(started["cold"], started["warm"], strict=True):
        a, b = _report(cold), _report(warm)
        draws = a.pop("draws"), b.pop("draws")
        assert a.pop("frozen") == 0 and b.pop("frozen") > 0  # the launcher's imports: out of the collector's way
        assert a == b
        assert draws[0] != draws[1]
    assert _report(started["warm"][0])["signals"]["SIGTERM"] == "<Handlers.SIG_DFL: 0>"
    first, second = (_report(c)["draws"] for c in started["warm"][:2])
    assert first[0] != second[0] and first[1] != second[1]  # Python's and numpy's generators reseeded in each


def test_a_forked_rank_ends_as_a_cold_one(started):
    """Exit status (SystemExit's code, 1 for an error, -N for the signal that killed it, SIGINT's for an
    unhandled KeyboardInterrupt), the traceback and atexit handlers, as the launcher's `poll()` sees them."""
    codes = {mode: [c["code"] for c in started[mode]] for mode in ("cold", "warm")}
    assert codes["warm"] == codes["cold"] == [0, 0, 3, 1, -2, -9], codes
    for cold, warm in zip(started["cold"], started["warm"], strict=True):  # (a traceback's outer frames differ:
        said = [[line for line in c["out"].splitlines() if not line.startswith(("REPORT ", " "))] for c in (cold, warm)]
        assert said[0] == said[1]  # the launcher's before runpy's)
    error = started["warm"][ENDINGS.index("error")]["out"]
    assert "Traceback" in error and error.rstrip().endswith("ATEXIT ran") and "ValueError: boom" in error
    assert "ATEXIT ran" not in started["warm"][ENDINGS.index("kill")]["out"]


# The torch half of the entry point replaced by a recorder: it notes the environment when it is
# imported, then ends the attempt (the training behind it is not what is checked here).
RECORDING_RANK = """
import gc, importlib.abc, importlib.util, json, os, sys
from clusterfsdp.core.records import RankOutcome

class Rank(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "clusterfsdp.worker.rank" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        print(json.dumps([os.environ.get("CLUSTERFSDP_TEST_MARK"), gc.isenabled()]), flush=True)
        module.train_rank = lambda *args: RankOutcome.COMPLETED

sys.meta_path.insert(0, Rank())
from clusterfsdp.worker import main
main.run(sys.argv[1])
print(json.dumps([gc.isenabled(), gc.get_freeze_count(), "transformers.models.llama.modeling_llama" in sys.modules]))
"""


def test_a_cold_rank_imports_torch_under_the_jobs_env(tmp_path):
    """`main.run` applies the job's [env] before it imports the torch half (worker/rank.py, which
    imports torch and transformers at their tops), as the warm launcher does before its preload:
    huggingface_hub reads HF_HOME, HF_HUB_OFFLINE, ... when it is imported. It imports it as the
    launcher does, too: with the garbage collector off, then the model family's module, then the
    objects frozen and the collector back on (a cold rank's CPU: bench/coldrank_bench.py). The rank
    module is a recorder (an import hook): no process group, no model."""
    tail = '[env]\nCLUSTERFSDP_TEST_MARK = "from the job"\n'
    run = make_run(tiny_job_toml("envorder", 1, 1, tail=tail), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERFSDP_TEST_MARK"}
    done = subprocess.run([sys.executable, "-c", RECORDING_RANK, str(run.path)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    at_import, after = (json.loads(line) for line in done.stdout.strip().splitlines()[:2])
    assert at_import == ["from the job", False]
    on, frozen, family = after
    assert on and family and frozen > 100_000  # torch and transformers alone make ~370,000 objects


# `frozen_imports` around imports that make cyclic garbage, raise, or run with the collector off.
FREEZING = """
import gc, json, sys, types, weakref
from clusterfsdp.worker import warmstart

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

seen = {}
with warmstart.frozen_imports():
    seen["off inside"] = not gc.isenabled()
    dead = cycle()  # garbage already: collected on leaving, not frozen
    kept = Node()
seen["garbage freed"] = dead() is None
seen["kept frozen"] = gc.get_freeze_count() > 0 and kept is not None
seen["on after"] = gc.isenabled()
try:
    with warmstart.frozen_imports():
        raise ImportError("no such module")
except ImportError:
    seen["on after an error"] = gc.isenabled()
def unreadable(spec, run_dir):
    raise FileNotFoundError("model/config.json")

warmstart.family_modules = unreadable  # (a model folder gone since submit)
warmstart.import_frozen(None, None, ("json",))
seen["an unreadable model folder is left to the builder"] = gc.isenabled()
gc.disable()
with warmstart.frozen_imports():
    pass
seen["a caller's off stays off"] = not gc.isenabled()
print(json.dumps(seen))
"""


def test_frozen_imports_free_their_garbage_and_put_the_collector_back():
    """The collector is off only inside; import-time cycles are collected before the freeze (not
    kept for good); an import error and a caller that had turned the collector off each leave it
    as they found it; a model family that cannot be found is not imported early, and the rank's
    model builder reports the folder in its own words (no error from the early import)."""
    done = subprocess.run([sys.executable, "-c", FREEZING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == dict.fromkeys(seen, True) and len(seen) == 7, seen
