"""The run folder: the one contract between the control plane, the workers, status, resume, the
TUI and the notebook (docs/run-folder.md lists every file and key).

    <run_root>/<job name>/<run id>/
        job.toml                 resolved spec, secrets redacted
        state.json               RunRecord: written by the control plane only, under .lock
        events.jsonl             Event lines: written by the workers (rank 0; a failing rank its own)
        metrics.jsonl            one JSON object per logged step (rank 0)
        submitit/                submitit's folder (pickles, <job id>_<task>_log.out/err)
        logs/<job id>.<restart>/rank<R>.log      per-rank log of one attempt
        nodes/<job id>.<restart>/<host>.json     what each node chose (interface, HCAs, versions)
        model/                   copies of the model's config.json, generation_config.json and the
                                 tokenizer's files (never weights), sources.json: what hub ids resolved to
        checkpoints/step-<N>/    DCP checkpoints (control.ckptfolder)
        samples/step-<N>.jsonl   what the model generated at the evaluation of step N ([eval] samples)
        data.json                the statistics of the sample sets it reads (prepared index meta.json)
        .lock                    held while a command changes the run (resume, cancel)
        .attempt.lock            held by rank 0 of the attempt that is training

Every path is derived from the run folder and a job id, so nothing needs a database.
Writes are atomic (temp file + rename) or append-only lines, so a crash never leaves a
half-written state file.

Run roots may be shared (a group folder, /scratch), so a run folder may have been written by
another user: its state.json names the process group `cancel` signals and the job `scancel`
stops, its job.toml the `slurm.setup` lines a resume runs. `refusal` is the one rule for every
command that acts on a run (docs/run-folder.md, "Whose runs are acted on").
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import ownership
from .errors import UserError
from .fileio import append_jsonl, atomic_write, load_json, read_jsonl
from .records import Attempt, Event, Executor, RunRecord, TrackerIds
from .runroot import ENV_RUN_ROOT, default_run_root, lookup_roots
from .value import value

if TYPE_CHECKING:  # imported where a spec is loaded or written: `status` and `runs` start without it
    # the spec's schema: `status` and `runs` read run folders without it (start-up)
    from . import spec as specmod


class RunNotFound(UserError, LookupError):
    pass


def new_run_id() -> str:
    # os.urandom(2).hex() is secrets.token_hex(2), without the hmac/hashlib `secrets` imports (start-up)
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(2).hex()


@value(frozen=True)
class RunFolder:
    """Paths and typed reads/writes of one run folder. No policy: the run service (control.run)
    decides who may write what, and when."""

    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def name(self) -> str:
        return self.path.parent.name

    job_toml = property(lambda self: self.path / "job.toml")
    state_file = property(lambda self: self.path / "state.json")
    events_file = property(lambda self: self.path / "events.jsonl")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    submitit_dir = property(lambda self: self.path / "submitit")
    logs_dir = property(lambda self: self.path / "logs")
    nodes_dir = property(lambda self: self.path / "nodes")
    lock_file = property(lambda self: self.path / ".lock")
    attempt_lock_file = property(lambda self: self.path / ".attempt.lock")
    sbatch_script = property(lambda self: self.path / "sbatch.sh")
    model_dir = property(lambda self: self.path / "model")  # what export/resume need from the sources
    trackers_file = property(lambda self: self.path / "trackers.json")
    tensorboard_dir = property(lambda self: self.path / "tensorboard")
    samples_dir = property(lambda self: self.path / "samples")  # [eval] samples (core.evalsamples)
    data_file = property(lambda self: self.path / "data.json")  # the sample sets' statistics (control.samplestats)

    def checkpoints_dir(self, spec: specmod.JobSpec | None = None) -> Path:
        spec = spec or self.spec()
        return self.checkpoints_in(spec.checkpoint.dir)

    def checkpoints_in(self, checkpoint_dir: str) -> Path:
        """The run's checkpoints when `checkpoint.dir` is `checkpoint_dir` ("": in the run folder)."""
        return Path(checkpoint_dir).expanduser() / self.id if checkpoint_dir else self.path / "checkpoints"

    def spec(self, overrides: list[str] | tuple[str, ...] = ()) -> specmod.JobSpec:
        # the spec's schema: `status` and `runs` read run folders without it (start-up)
        from . import spec as specmod

        return specmod.load(self.job_toml, list(overrides))

    # ---- state.json (control plane)
    def record(self) -> RunRecord:
        """The run's state file; an unreadable one reads as a run with no attempts."""
        try:
            return RunRecord.from_dict(load_json(self.state_file))
        except (OSError, ValueError, KeyError, TypeError):
            return RunRecord(self.id, self.name, Executor.LOCAL, 0.0)

    def write_record(self, record: RunRecord) -> None:
        atomic_write(self.state_file, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")

    def add_attempt(self, job_id: str, executor: Executor, reason: str, **fields: Any) -> Attempt:
        record = self.record()
        attempt = Attempt(len(record.attempts), job_id, executor, time.time(), reason, **fields)
        record.attempts.append(attempt)
        self.write_record(record)
        return attempt

    def update_attempt(self, job_id: str, **changes: Any) -> None:
        record = self.record()
        attempt = record.attempt(job_id)
        if attempt is not None:
            for key, value in changes.items():
                setattr(attempt, key, value)
            self.write_record(record)

    @property
    def attempts(self) -> list[Attempt]:
        return self.record().attempts

    # ---- per-attempt files (derived from the job id and Slurm's restart count)
    def attempt_key(self, job_id: str, restart: int) -> str:
        return f"{job_id}.{restart}"

    def log_path(self, job_id: str, restart: int, rank: int) -> Path:
        return self.logs_dir / self.attempt_key(job_id, restart) / f"rank{rank}.log"

    def node_record(self, job_id: str, restart: int, host: str) -> Path:
        return self.nodes_dir / self.attempt_key(job_id, restart) / f"{host}.json"

    def log_files(self) -> list[Path]:
        """All per-rank logs, oldest attempt first."""
        return sorted(self.logs_dir.glob("*/rank*.log"), key=lambda p: (p.stat().st_mtime, p.name))

    # ---- worker-owned records
    def events(self, job_id: str | None = None) -> list[Event]:
        """Events in order (those of one job id if given); lines of unknown kinds are skipped."""
        events = [e for e in map(Event.from_dict, read_jsonl(self.events_file)) if e is not None]
        return [e for e in events if e.job_id == job_id] if job_id is not None else events

    def append_event(self, event: Event) -> None:
        append_jsonl(self.events_file, event.to_dict())

    def metrics(self, *, latest: bool = False) -> list[dict[str, Any]]:
        """metrics.jsonl rows in the order written. `latest`: the rows of the trajectory that
        training went on with: a row whose step is not past the previous one started again from a
        checkpoint (requeue, `resume`, `resume --step`), so it drops the rows it repeated or
        abandoned (every kept row at that step or later). Steps are then increasing and unique."""
        rows = read_jsonl(self.metrics_file)
        if not latest:
            return rows
        kept: list[dict[str, Any]] = []
        for row in rows:
            step = row.get("step")
            if not isinstance(step, int):
                continue
            while kept and kept[-1]["step"] >= step:
                kept.pop()
            kept.append(row)
        return kept

    def tracker_ids(self) -> TrackerIds:
        try:
            return TrackerIds.from_dict(load_json(self.trackers_file))
        except (OSError, ValueError, TypeError, AttributeError):
            return TrackerIds()

    def write_tracker_ids(self, ids: TrackerIds) -> None:
        atomic_write(self.trackers_file, json.dumps(ids.to_dict(), indent=2, sort_keys=True) + "\n")


def job_folder(spec: specmod.JobSpec) -> Path:
    """`<run_root>/<job.name>`: where the job's runs are made."""
    root = Path(spec.job.run_root).expanduser().resolve() if spec.job.run_root else default_run_root()
    return root / spec.job.name


def _new_folder(parent: Path, run_id: str | None, tries: int = 8) -> RunFolder:
    """A run folder made here and now, never one that already exists (exist_ok=False): a given id
    that exists raises FileExistsError; a generated id that collides (two runs of one job in the same
    second, 1 in 65,536: a sweep's fast dry runs) is drawn again."""
    for _ in range(1 if run_id else tries):
        run = RunFolder(parent / (run_id or new_run_id()))
        try:
            run.path.mkdir(parents=True, exist_ok=False)
            return run
        except FileExistsError:
            if run_id:
                raise
    raise FileExistsError(f"{parent}: {tries} new run ids in a row already existed")


def create_run(spec: specmod.JobSpec, executor: Executor, run_id: str | None = None) -> RunFolder:
    """Make the folder for a new run and write its resolved, redacted job.toml. PermissionError
    (submit_refusal) in a job folder another user made: the run service says it first, as a
    RunError; this guards the notebook's runs too."""
    # the spec's schema: `status` and `runs` read run folders without it (start-up)
    from . import spec as specmod

    if problem := submit_refusal(spec):
        raise PermissionError(problem)
    run = _new_folder(job_folder(spec), run_id)
    for sub in ("submitit", "logs", "nodes"):
        (run.path / sub).mkdir()
    atomic_write(run.job_toml, specmod.dumps(spec, redact=True))
    run.write_record(RunRecord(run.id, spec.job.name, executor, time.time()))
    return run


def iter_runs(run_root: str | Path) -> Iterator[RunFolder]:
    root = Path(run_root).expanduser()
    if not root.is_dir():
        return
    for state in root.glob("*/*/state.json"):
        yield RunFolder(state.parent.resolve())


def list_runs(run_root: str | Path) -> list[RunFolder]:
    """Runs under run_root, newest first (run ids start with their creation time)."""
    return sorted(iter_runs(run_root), key=lambda r: r.id, reverse=True)


def find_run(ref: str, run_root: str | Path | None = None) -> RunFolder:
    """A run from its folder path, its id, or a unique prefix of its id (under `run_root`,
    default: `runroot.lookup_roots()`, the default run root and those of the job files here)."""
    p = Path(ref).expanduser()
    if (p / "state.json").is_file():
        return RunFolder(p.resolve())
    roots = [Path(run_root).expanduser()] if run_root is not None else lookup_roots()
    found = list(dict.fromkeys(r for root in roots for r in iter_runs(root)))
    matches = [r for r in found if r.id == ref] or [r for r in found if r.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        where = " or ".join(map(str, roots))
        raise RunNotFound(f"no run {ref!r} under {where} (give the run folder, --run-root, or set ${ENV_RUN_ROOT})")
    raise RunNotFound(f"{ref!r} matches {len(matches)} runs: {', '.join(r.id for r in matches[:5])}")


# ---- whose runs are acted on


def owner(run: RunFolder) -> str:
    """The name of the user who owns the run folder ('?' when it cannot be read)."""
    try:
        return ownership.user_name(run.path.stat().st_uid)
    except OSError:
        return "?"


def untrusted(path: Path) -> str | None:
    """Why another user could have written `path` (None: they could not; `ownership.verdict`)."""
    try:
        st = path.stat()
    except OSError as e:
        return f"{path}: {e.strerror}"
    why = ownership.verdict(st)
    if why is ownership.Untrusted.OWNER:
        return f"{path} is owned by {ownership.user_name(st.st_uid)}, not by you ({ownership.user_name(os.geteuid())})"
    if why is ownership.Untrusted.WORLD_WRITABLE:
        return f"{path} is writable by every user"
    if why is ownership.Untrusted.GROUP_WRITABLE:
        return f"{path} is writable by group {ownership.group_name(st.st_gid)}"
    return None


def refusal(run: RunFolder, action: str) -> str | None:
    """The one-line refusal for `action` (cancel, resume, export, ...) on a run another user
    could have planted or changed, or None. Checked: the folder, state.json, job.toml and the
    checkpoint folder (which may live elsewhere: checkpoint.dir). Read-only commands (status,
    runs, logs, the TUI's lists) show every run and need no check."""
    from . import spec as specmod  # here: `status` and `runs` start without the spec

    paths = [run.path, run.state_file, run.job_toml]
    try:
        checkpoints = run.checkpoints_dir()
    except (OSError, specmod.SpecError):
        checkpoints = None
    if checkpoints is not None and checkpoints.exists():
        paths.append(checkpoints)
    problem = next((p for p in map(untrusted, paths) if p is not None), None)
    if problem is None:
        return None
    hint = f"to act on a group's runs: ${ownership.ENV_TRUSTED_GROUP}=<group>"
    return f"refusing to {action} run {run.path}: {problem} ({hint})"


def submit_refusal(spec: specmod.JobSpec) -> str | None:
    """A job folder (`<run_root>/<job.name>`) that exists and is not yours: a new run made in it
    could be renamed away or replaced by its owner."""
    folder = job_folder(spec)
    problem = untrusted(folder) if folder.exists() else None
    if problem is None:
        return None
    return f"refusing to submit into {folder}: {problem}; choose another job.name or run root"


def _data_folders(spec: specmod.JobSpec) -> list[Path]:
    """What the job reads its data from: each absolute data path, a glob cut before its first
    component with a wildcard (`/data/corpus/*.jsonl` -> /data/corpus)."""
    patterns = [*spec.data.paths, *spec.eval.paths, *(s.path for s in spec.data.sources)]
    out = []
    for pattern in patterns:
        parts = Path(pattern).expanduser().parts
        fixed = [p for p in itertools.takewhile(lambda p: not any(c in p for c in "*?["), parts)]
        if fixed and Path(*fixed).is_absolute():
            out.append(Path(*fixed))
    return out


def export_refusal(run: RunFolder, to: str | Path) -> str | None:
    """Why `export --to` may not write (and with --force replace) `to`, or None: it is `/`, is or
    contains the home folder, or is, contains or lies inside the run root, the run, its
    checkpoints, a source folder of its model or tokenizer, its data (each data path, a glob's
    folder before its first wildcard) or data.cache_dir. Symlinks are resolved first, so a link
    to one of them is refused too."""
    # the spec's schema: `status` and `runs` read run folders without it (start-up)
    from . import spec as specmod

    dest = Path(to).expanduser().resolve()
    home = Path.home().resolve()
    if dest == Path(dest.anchor) or home.is_relative_to(dest):
        return f"refusing --to {dest}: it is or contains your home folder {home}; export to a new folder"
    guarded = [("the run", run.path)]
    try:
        spec = run.spec()
        guarded.append(("the run's checkpoints", run.checkpoints_dir(spec)))
        sources = (spec.model.name_or_path, spec.model.config, spec.data.tokenizer)
        guarded += [("the model's source folder", Path(p)) for p in sources if p and Path(p).is_absolute()]
        guarded += [("the run's data", path) for path in _data_folders(spec)]
        if spec.data.cache_dir:
            guarded.append(("the data cache (data.cache_dir)", Path(spec.data.cache_dir)))
    except (OSError, specmod.SpecError):
        pass
    guarded += [("the run root", run.path.parent.parent), ("the run root", default_run_root())]
    resolved = [(label, path.expanduser().resolve()) for label, path in guarded]
    relations = (
        ("is", lambda path: dest == path),
        ("lies inside", dest.is_relative_to),
        ("contains", lambda path: path.is_relative_to(dest)),
    )
    for relation, holds in relations:  # the closest relation names the folder best
        for label, path in resolved:
            if holds(path):
                return f"refusing --to {dest}: it {relation} {label} {path}; export to a folder outside it"
    return None
