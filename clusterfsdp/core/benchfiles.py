"""What the tasks of [benchmarks] need on disk, checked before queueing (submit, validate,
`bench`), without importing lm_eval (it imports torch; the control plane never does).

A local task is a YAML file in lm-evaluation-harness's task format; its `task` key names it and
its `dataset_kwargs.data_files` (relative paths: relative to the YAML's folder) are the data, so
a cluster without internet evaluates it. A task given by name must be one the installed lm-eval
ships: some YAML under its `lm_eval/tasks/` folder declares it as `task`, `group` or `tag`
(found with `importlib.util.find_spec`, which locates the package without running it; a text
scan of those files, not lm-eval's own TaskManager, which would import torch). Named tasks read
their data from the Hugging Face hub (or its cache): the worker runs offline only for local ones.

A local task may name Python (`!function utils.fn`: `utils.py` beside the YAML) that lm-eval
imports: each task file, its `include:`s and that code must be yours or the trusted group's
(core/ownership.py's rule), checked before queueing and again by the worker before lm-eval
reads it. Its `dataset_path` must be a local builder with local data_files, a local folder, or a
hub dataset already in the local cache: evaluations of local tasks run offline.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import hub, ownership
from .spec import benchmetric
from .spec.benchsection import BenchmarksSection, is_local
from .spec.schema import closest, short
from .value import value

_DECLARES = re.compile(r"^(?:task|group|tag):\s*['\"]?([A-Za-z0-9_.\-]+)", re.M)


@value(frozen=True)
class LocalTask:
    """A local task YAML: its file, the task name it declares, its data files (absolute)."""

    path: Path
    name: str
    data_files: tuple[Path, ...]


class TaskFileError(ValueError):
    """A local task file that cannot be used; the message is one line naming the file."""


LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")  # datasets' builders of local data_files


def _loader(functions: list[str]) -> Any:
    """A safe YAML loader that reads lm-eval's `!function module.name` tags as plain text, each
    appended to `functions` (they name Python code next to the YAML, which only the worker's
    lm-eval loads: `sources` checks whose it is first)."""
    # PyYAML only when a task file is read (lm-eval's format; start-up of `validate`)
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        functions.append(str(node.value))
        return str(node.value)

    Loader.add_constructor("!function", function)
    return Loader


def _trusted(path: Path, what: str) -> None:
    """TaskFileError unless `path` is yours or the trusted group's (core/ownership.py's rule):
    lm-eval imports the Python a task file names, so another user's file would run as you."""
    if found := ownership.path_clause(path):
        raise TaskFileError(f"{found[1]}: refusing to load it as {what} (lm-eval would run its code as you); "
                            "copy it into a folder of yours")  # fmt: skip


def _load(path: Path, seen: set[Path]) -> dict[str, Any]:
    """One task YAML merged over its `include:`s as lm-eval merges them (relative to the including
    file's folder; the file's own keys win), each file and each local `.py` that a `!function`
    names (`utils.fn` -> `utils.py` beside the YAML) checked to be yours before it is read."""
    # PyYAML only when a task file is read (lm-eval's format; start-up of `validate`)
    import yaml

    path = path.expanduser().resolve()
    if path in seen:
        raise TaskFileError(f"{path}: includes itself")
    seen.add(path)
    _trusted(path, "an lm-eval task file")
    functions: list[str] = []
    try:
        config = yaml.load(path.read_text(), Loader=_loader(functions))  # a SafeLoader subclass
    except FileNotFoundError:
        raise TaskFileError(f"{path}: no such task file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        raise TaskFileError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise TaskFileError(f"{path}: an lm-eval task file is a YAML table")
    for name in functions:
        module = path.parent / f"{name.rpartition('.')[0].replace('.', '/')}.py"
        _trusted(module, f"the code of {path}'s !function {name}")
    includes = config.pop("include", None)
    merged: dict[str, Any] = {}
    for inc in includes if isinstance(includes, list) else [includes] if includes else []:
        merged.update(_load(path.parent / str(inc), seen))
    return {**merged, **config}


def _hub_dataset(name: str) -> str | None:
    """Where `dataset_path` = `name` (a hub dataset id, not a local folder) is cached here, or
    None: datasets' own cache (`<HF_DATASETS_CACHE>/<org>___<name>`) or the hub's
    (`datasets--<org>--<name>`). Evaluations of local tasks run offline: one not cached fails."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    found = [datasets_cache / name.replace("/", "___"), Path(hub.cache_dir()) / f"datasets--{name.replace('/', '--')}"]
    return next((str(p) for p in found if p.is_dir()), None)


def data_files(config: dict[str, Any], folder: Path) -> dict[str, list[Path]] | None:
    """`dataset_kwargs.data_files` as split -> absolute paths (relative ones against `folder`,
    the YAML's); None when the task names no local files. lm-eval passes data_files to
    `datasets.load_dataset` as written: a string, a list, or a table of split -> either."""
    kwargs = config.get("dataset_kwargs")
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    if files is None:
        return None
    table = files if isinstance(files, dict) else {"train": files}
    return {
        str(split): [folder / Path(str(p)).expanduser() for p in (paths if isinstance(paths, list) else [paths])]
        for split, paths in table.items()
    }


def local_task(path: Path) -> LocalTask:
    """Read one local task YAML (TaskFileError: a one-line reason naming the file): its files
    and code yours, its data local (a dataset_path that needs the hub must be in the cache)."""
    config = _load(path, set())
    if not isinstance(config.get("task"), str) or not config["task"]:
        raise TaskFileError(f"{path}: an lm-eval task file needs a `task:` name")
    files = data_files(config, path.parent) or {}
    source = config.get("dataset_path")
    if not files and source in LOCAL_BUILDERS:
        raise TaskFileError(f"{path}: dataset_path {source!r} needs dataset_kwargs.data_files")
    if (
        isinstance(source, str)
        and source not in LOCAL_BUILDERS
        and not Path(source).expanduser().exists()
        and hub.looks_like_repo_id(source)
        and _hub_dataset(source) is None
    ):
        raise TaskFileError(
            f"{path}: dataset_path {source!r} is a Hugging Face hub dataset that is not in the local cache, and "
            "evaluations run offline: set dataset_path to json, csv or parquet with dataset_kwargs.data_files "
            "(local files), or download it into the cache first"
        )
    return LocalTask(path, config["task"], tuple(p for paths in files.values() for p in paths))


@functools.cache
def known_task_names() -> frozenset[str] | None:
    """Every task, group and tag name the installed lm-eval's own YAML files declare; None when
    lm-eval is not installed here."""
    try:
        spec = importlib.util.find_spec("lm_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    names: set[str] = set()
    for root, _, files in os.walk(Path(next(iter(spec.submodule_search_locations))) / "tasks"):
        for name in files:
            if name.endswith((".yaml", ".yml")):
                try:
                    names.update(_DECLARES.findall(Path(root, name).read_text(errors="replace")))
                except OSError:
                    continue
    return frozenset(names)


def problems(b: BenchmarksSection, scores: Sequence[tuple[str, str]] = ()) -> list[str]:
    """One line per task of [benchmarks] that would not run: a local YAML missing, broken, not
    yours (or naming code that is not), a data file it names missing, data it would need the
    internet for, two local files declaring the same task, a name the installed lm-eval does not
    ship (or no lm-eval here to check it against); and per (key, benchmark score) of `scores`
    (keep_best, early stopping: `benchmetric.used`) whose task is none of these."""
    out, seen = [], {}
    names = [t for t in b.tasks if not is_local(t)]
    for i, task in enumerate(b.tasks):
        key = f"benchmarks.tasks[{i}]"
        if is_local(task):
            try:
                found = local_task(Path(task))
            except TaskFileError as e:
                out.append(f"{key}: {e}")
                continue
            out += [f"{key}: {task}: data file {p} does not exist" for p in found.data_files if not p.is_file()]
            if found.name in seen:
                out.append(f"{key}: {task} declares task {found.name!r}, as {seen[found.name]} does")
            seen[found.name] = task
            names.append(found.name)
            continue
        known = known_task_names()
        if known is None:
            out.append(
                f"{key}: {short(task)} is an lm-eval task name and lm-eval is not installed here to check it "
                "(pip install 'clusterfsdp[bench]'), or give a local task .yaml file"
            )
        elif task not in known:
            near = closest(task, sorted(known))
            hint = f" (did you mean {near!r}?)" if near else ""
            out.append(f"{key}: {short(task)} is no lm-eval task{hint}; name one or give a local task .yaml file")
    for key, score in scores:
        task = score.split("/")[1]
        if len(seen) == sum(map(is_local, b.tasks)) and task not in {benchmetric.flat(n) for n in names}:
            listed = ", ".join(benchmetric.flat(n) for n in names)
            out.append(f"{key}: {score!r} names task {task!r}, which is not in benchmarks.tasks (its tasks: {listed})")
    return out


def task_names(b: BenchmarksSection) -> list[str]:
    """The lm-eval task names of [benchmarks], in order (a local file's: its `task` key)."""
    return [local_task(Path(t)).name if is_local(t) else t for t in b.tasks]
