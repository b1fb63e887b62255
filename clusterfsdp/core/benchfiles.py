"""What the tasks of [benchmarks] need on disk, checked before queueing (submit, validate,
`bench`), without importing lm_eval (it imports torch; the control plane never does).

A local task is a YAML file in lm-evaluation-harness's task format; its `task` key names it and
its `dataset_kwargs.data_files` (relative paths: relative to the YAML's folder) are the data, so
a cluster without internet evaluates it. A task given by name must be one the installed lm-eval
ships: some YAML under its `lm_eval/tasks/` folder declares it as `task`, `group` or `tag`
(found with `importlib.util.find_spec`, which locates the package without running it; a text
scan of those files, not lm-eval's own TaskManager, which would import torch). Named tasks read
their data from the Hugging Face hub (or its cache): the worker runs offline only for local ones.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from .spec.benchsection import BenchmarksSection, is_local
from .spec.schema import short
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


def _loader() -> Any:
    """A safe YAML loader that reads lm-eval's `!function module.name` tags as plain text (they
    name Python code next to the YAML, which only the worker's lm-eval loads)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        return str(node.value)

    Loader.add_constructor("!function", function)
    return Loader


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
    """Read one local task YAML (TaskFileError: a one-line reason naming the file)."""
    import yaml

    try:
        config = yaml.load(path.read_text(), Loader=_loader())  # a SafeLoader subclass
    except FileNotFoundError:
        raise TaskFileError(f"{path}: no such task file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        raise TaskFileError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("task"), str) or not config["task"]:
        raise TaskFileError(f"{path}: an lm-eval task file needs a `task:` name")
    files = data_files(config, path.parent) or {}
    if not files and config.get("dataset_path") in ("json", "csv", "parquet", "text", "arrow"):
        raise TaskFileError(f"{path}: dataset_path {config['dataset_path']!r} needs dataset_kwargs.data_files")
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


def problems(b: BenchmarksSection) -> list[str]:
    """One line per task of [benchmarks] that would not run: a local YAML missing or broken, a
    data file it names missing, two local files declaring the same task, a name the installed
    lm-eval does not ship (or no lm-eval here to check it against)."""
    out, seen = [], {}
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
            continue
        known = known_task_names()
        if known is None:
            out.append(
                f"{key}: {short(task)} is an lm-eval task name and lm-eval is not installed here to check it "
                "(pip install 'clusterfsdp[bench]'), or give a local task .yaml file"
            )
        elif task not in known:
            from .spec.schema import closest

            near = closest(task, sorted(known))
            hint = f" (did you mean {near!r}?)" if near else ""
            out.append(f"{key}: {short(task)} is no lm-eval task{hint}; name one or give a local task .yaml file")
    return out


def task_names(b: BenchmarksSection) -> list[str]:
    """The lm-eval task names of [benchmarks], in order (a local file's: its `task` key)."""
    return [local_task(Path(t)).name if is_local(t) else t for t in b.tasks]
