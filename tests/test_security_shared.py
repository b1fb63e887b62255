"""A shared cluster, second round (issue 34): what another user created in a shared place is never
executed, unpickled, deleted through or trained on. A real second local user (tests/users.py)
plants the files; the commands run as the test's user (root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import launch, tiny_job_toml, wait
from procs import make_run as make_run_folder
from tui_helpers import make_run

from clusterfsdp.core.records import EventKind

BIN = str(Path(sys.executable).parent)  # the venv's `clusterfsdp` script, which the completion calls


def _completion(shell: str, words: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "completion", shell], capture_output=True, text=True, check=True
    ).stdout
    line = " ".join(f"'{w}'" for w in words)
    setup = f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}"
    call = '_clusterfsdp; printf "%s\\n" "${COMPREPLY[@]}"'
    if shell == "zsh":
        call = f"compgen -F _clusterfsdp -- '{words[-1]}'"
    return subprocess.run(
        [shell, "-c", f"{setup}\n{call}"], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_completing_a_run_id_never_runs_a_planted_folder_name(tmp_path, other_user, shared_root):
    """Reproduced: `compgen -W "$(clusterfsdp runs --quiet)"` expanded a run folder named
    `$(touch ...)`, running it as whoever pressed TAB (root). Both shells, both expansions
    (command substitution and backquotes); the real ids still complete."""
    staging = tmp_path / "staging"
    mine = make_run(shared_root, "20260101-120000-aaaa")
    proofs = [tmp_path / "pwned-dollar", tmp_path / "pwned-backquote"]  # the shells run in tmp_path
    for name in (f"$(touch {proofs[0].name})", f"`touch {proofs[1].name}`"):
        make_run(staging, name, name="planted")
    other_user.plant_copy(staging / "planted", shared_root)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CLUSTERFSDP_RUN_ROOT": str(shared_root)}
    listed = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "runs", "--quiet"], capture_output=True, text=True, env=env
    ).stdout
    assert "$(touch" in listed and "`touch" in listed  # the planted names do reach the completion
    for shell in ("bash", "zsh"):
        for prefix in ("", "$", "`", "2026"):
            done = _completion(shell, ["clusterfsdp", "status", prefix], env, tmp_path)
            assert done.returncode == 0, done.stderr
            offered = [w for w in done.stdout.split() if w]
            assert not any(p.exists() for p in proofs), (shell, prefix)
            assert offered == ([mine.id] if prefix in ("", "2026") else []), (shell, prefix, offered)


def test_a_checkpoint_folder_another_user_made_for_your_run_is_refused_before_training(
    tmp_path, other_user, shared_root
):
    """Reproduced: the worker used `<checkpoint.dir>/<run id>` with mkdir(exist_ok=True). A run id
    is public once its folder exists (a pending job, a dry run), so another user made that folder
    first, with a checkpoint of theirs (which resume would load) and `.pruning` linked to the
    victim's folder (whose entries the pruner deleted). Every rank refuses it with one line naming
    the folder and its owner, before the first step; nothing of the victim's is touched."""
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    run = make_worker_run(tmp_path, f"checkpoint.dir={str(shared_root / 'ckpt')!r}")
    planted = shared_root / "ckpt" / run.id
    other_user.plant(planted, {"step-00000004/clusterfsdp.json": b'{"step": 4}', "step-00000004/.metadata": b"x"})
    os.symlink(victim, planted / ".pruning")  # (as root: the link's owner does not matter, its folder's does)
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2), timeout=300)
    assert all(code != 0 for code, _ in out), out
    failed = [e for e in run.events() if e.event is EventKind.FAILED]
    assert failed and all("refusing to keep checkpoints there" in e.reason for e in failed), failed
    assert str(planted) in failed[0].reason and other_user.name in failed[0].reason
    assert not run.metrics(), "it trained"
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in planted.iterdir()) == [".pruning", "step-00000004"]


def make_worker_run(tmp_path: Path, *overrides: str):
    return make_run_folder(tiny_job_toml("shared", 0, 4), tmp_path / "runs", overrides)


def test_the_pruner_never_follows_a_link(tmp_path):
    """`.pruning` itself a link, or a link inside it: the link goes, what it points at stays."""
    from clusterfsdp.worker.checkpoint import _Pruner

    victim = tmp_path / "precious"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "f").write_text("keep")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / ".pruning").symlink_to(victim)
    pruner = _Pruner(root)
    pruner.close()
    assert (victim / "sub" / "f").read_text() == "keep"
    (root / ".pruning").unlink()
    (root / ".pruning").mkdir()
    (root / ".pruning" / "step-1-123").symlink_to(victim)
    (root / ".pruning" / "step-2-123").mkdir()
    pruner = _Pruner(root)
    pruner.close()
    assert (victim / "sub" / "f").read_text() == "keep" and not any((root / ".pruning").iterdir())


def test_a_checkpoint_dir_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    from clusterfsdp.core import ckptfolder

    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    problem = ckptfolder.claim(loose / "run1", create=True)
    assert problem and "without the sticky bit" in problem and str(loose) in problem
    loose.chmod(0o1777)  # /tmp-like: others cannot rename what is yours
    assert ckptfolder.claim(loose / "run2", create=True) is None
    assert (loose / "run2").is_dir()


# Run as the other user: load the victim's dataset folder into the shared cache with datasets'
# own API, then rewrite every cached Arrow file's text column (what `load_dataset` reuses).
_POISON_DATASETS_CACHE = """
import glob, sys
import datasets, pyarrow as pa
folder, cache = sys.argv[1], sys.argv[2]
datasets.load_dataset(folder, split="train", cache_dir=cache)
files = glob.glob(cache + "/**/*.arrow", recursive=True)
assert files, "datasets cached nothing"
for f in files:
    with pa.memory_map(f) as src:
        table = pa.ipc.open_stream(src).read_all()
    column = table.schema.get_field_index("text")
    table = table.set_column(column, "text", pa.array(["PLANTED BY ANOTHER USER"] * len(table)))
    with pa.OSFile(f, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
"""


def test_rows_another_user_planted_in_datasets_own_cache_are_never_prepared(tmp_path, other_user, shared_root):
    """Reproduced: the prepared-data cache checked its own entries but not `<cache>/hf-datasets`,
    datasets' cache inside it: another user (who can read your data folder, as on a shared
    filesystem) loaded it into that cache first and rewrote the cached rows, which ended up
    tokenized into your own, correctly sealed prepared dataset. Now refused with one line naming
    the folder and its owner."""
    from data_helpers import job, write_jsonl

    from clusterfsdp.data import prepare as dataprep
    from clusterfsdp.data.sources import DataError

    folder = shared_root / "data" / "ds"
    folder.mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", [{"text": f"document {i:02d} of the victim's"} for i in range(40)])
    for p in (shared_root / "data", folder, folder / "a.jsonl"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    cache = shared_root / "cache"
    cache.mkdir(mode=0o1777)
    cache.chmod(0o1777)  # a team's scratch cache: everyone may create entries in it
    done = other_user.run(
        [sys.executable, "-c", _POISON_DATASETS_CACHE, str(folder), str(cache / "hf-datasets")],
        env={**os.environ, "HF_HOME": str(shared_root / "hf-home")},
    )
    assert done.returncode == 0, done.stderr
    spec = job(tmp_path, [folder], "bytes", cache=cache)
    try:
        refs = dataprep.ensure(spec, workers=1)
    except DataError as e:
        message = str(e)
    else:
        tokens = sum((ref.manifest() or {})["tokens"] for ref in refs)  # bytes tokenizer: a token a byte, + EOS
        planted = 40 * (len("PLANTED BY ANOTHER USER") + 1)
        message = f"prepared {tokens} tokens" + (": the planted rows" if tokens == planted else "")
    assert "refusing to use it" in message and other_user.name in message and "hf-datasets" in message, message


def test_prepared_data_is_never_more_readable_than_its_sources(tmp_path, other_user, shared_root):
    """Reproduced: the cache gave every prepared dataset 0644/0755 modes, so data a user kept
    private (a 0700 folder) became readable by every user through a shared cache, and so did
    datasets' copy of its rows in `<cache>/hf-datasets`. Now a dataset prepared from files not
    every user can read is enterable by its owner only; world-readable sources stay shareable."""
    from data_helpers import job, write_jsonl

    from clusterfsdp.data import prepare as dataprep

    cache = shared_root / "cache"
    cache.mkdir()
    cache.chmod(0o1777)
    private = tmp_path / "private"  # (tmp_path's own parents are closed to others too)
    private.mkdir(mode=0o700)
    folder = private / "ds"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [{"text": f"secret {i}"} for i in range(40)])
    public = shared_root / "public.jsonl"
    write_jsonl(public, [{"text": f"open {i}"} for i in range(40)])
    public.chmod(0o644)
    (secret,) = dataprep.ensure(job(tmp_path, [folder], "bytes", cache=cache), workers=1)
    (shared,) = dataprep.ensure(job(tmp_path, [public], "bytes", cache=cache), workers=1)
    assert secret.folder.stat().st_mode & 0o777 == 0o700
    assert shared.folder.stat().st_mode & 0o777 == 0o755
    own = cache / "hf-datasets" / str(os.geteuid())  # datasets' copy of the rows
    assert own.stat().st_mode & 0o777 == 0o700 and any(own.rglob("*.arrow"))
    for path, readable in [
        (next(secret.folder.rglob("*.tok"), None) or next(p for p in secret.folder.rglob("*") if p.is_file()), False),
        (next(own.rglob("*.arrow")), False),
        (next(p for p in shared.folder.rglob("*") if p.is_file()), True),
    ]:
        done = other_user.run(["cat", str(path)])
        assert (done.returncode == 0) == readable, (path, done.stderr)


class _Touch:
    """A pickle that runs `touch` when it is loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_waiting_on_a_planted_run_never_unpickles_its_result_file(tmp_path, other_user, shared_root):
    """Reproduced: `Run.wait()` (a notebook's or script's wait) unpickled the submitit result file
    of a run another user planted in a shared run root, running their code as the caller."""
    import pickle

    from clusterfsdp.control import launch
    from clusterfsdp.control.run import Run

    staging = tmp_path / "staging"
    run = make_run(staging, "20260101-120000-bbbb", name="planted")
    proof = shared_root / "pwned"
    result = launch.attempt_job(run, run.record().attempts[0]).paths.result_pickle
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_bytes(pickle.dumps(("success", _Touch(proof))))
    other_user.plant_copy(staging / "planted", shared_root)
    planted = Run(shared_root / "planted" / run.id)
    with pytest.raises(launch.SubmitError, match="refusing to wait for run") as e:
        planted.wait(poll_s=0.1)
    assert other_user.name in str(e.value) and not proof.exists()
    staged = Run(run.path)  # the same files, yours: the result is read (and runs, being a pickle)
    staged.wait(poll_s=0.1)
    assert proof.exists()


def test_a_prepare_jobs_folder_another_user_made_is_refused(tmp_path, other_user, shared_root):
    """Reproduced: `data prepare --executor slurm` wrote submitit's pickles (which its tasks run as
    you) into `<cache>/.prepare-jobs` with no owner check, so another user who made that folder
    first could swap a task's pickle. Its files now go to `.prepare-jobs/<uid>` (0700), refused
    when another user made either."""
    from data_helpers import job

    from clusterfsdp.control import prepjob
    from clusterfsdp.core import ownership

    cache = shared_root / "cache"
    cache.mkdir()
    cache.chmod(0o1777)
    spec = job(tmp_path, [tmp_path / "d.jsonl"], "bytes", cache=cache)
    other_user.plant(cache, {".prepare-jobs/README": b"mine"})
    with pytest.raises(ownership.Refused, match=r"\.prepare-jobs belongs to cfsdp-other"):
        prepjob.cache_folder(spec)
    mine = tmp_path / "own-cache"
    folder = prepjob.cache_folder(job(tmp_path, [tmp_path / "d.jsonl"], "bytes", cache=mine))
    assert folder == mine / ".prepare-jobs" / str(os.geteuid()) and folder.stat().st_mode & 0o777 == 0o700


def test_a_snapshot_another_user_put_in_a_shared_hf_cache_is_refused(tmp_path, other_user, shared_root):
    """Reproduced: with HF_HOME on the shared filesystem (as the README recommends), a snapshot
    another user laid out under your hub id was used without a word: their weights, tokenizer or
    rows. validate and submit now refuse it with one line naming the file and its owner."""
    from procs import weights_folder
    from test_modelsource import job_file, put_in_hub_cache

    staging = tmp_path / "staging"
    put_in_hub_cache(staging / "hf", "org/tiny", weights_folder(tmp_path / "weights"))
    other_user.plant_copy(staging / "hf", shared_root)
    job = job_file(tmp_path, 'name_or_path = "org/tiny"')
    env = {**os.environ, "HF_HOME": str(shared_root / "hf"), "HF_HUB_OFFLINE": "1"}
    for command in (["validate", str(job)], ["submit", str(job), "--dry-run"]):
        done = subprocess.run(
            [sys.executable, "-m", "clusterfsdp", *command], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "refusing to use 'org/tiny'" in done.stderr and other_user.name in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("state.json"))
