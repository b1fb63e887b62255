"""A job's inputs checked before queueing (submit, resume) and for `validate`: the model's and the
tokenizer's sources resolved and checked (`modelsource`), then the data read (`data.checks`).
Apart from the run service so that `validate` imports only this, not the submit machinery (run,
backends, launch, lock): start-up is paid on every call (issue 25 item 3). For the same reason
`data.checks` (a dozen modules of data/) is imported only for a job that reads files: synthetic
tokens have nothing to check there."""

from __future__ import annotations

from pathlib import Path

from ..core import hub, modelsource
from ..core import spec as specmod
from ..core.spec import benchmetric, peft


def prepare_sources(spec: specmod.JobSpec, mode: hub.Mode = "download") -> modelsource.Prepared:
    """After the cheap checks: hub ids resolved (submit: a missing snapshot downloaded here, never
    on the compute nodes; validate: mode 'check'), the model and tokenizer folders checked, then
    the data sources read (readable, not smaller than a batch; they may need the resolved
    tokenizer). SpecError with every problem."""
    prepared = modelsource.prepare(spec, mode)
    problems = _peft_problems(prepared.spec) + data_problems(prepared.spec) + bench_problems(prepared.spec)
    if problems:
        raise specmod.SpecError(problems)
    return prepared


def data_problems(spec: specmod.JobSpec) -> list[str]:
    """`data.checks.problems`: what the job's data files would be refused for."""
    if spec.data.source != "files":
        return []
    # data/'s checks only for a job that reads files: `validate` of a synthetic one imports no data/
    from ..data import checks

    return checks.problems(spec)


def bench_problems(spec: specmod.JobSpec) -> list[str]:
    """`benchfiles.problems`: the [benchmarks] tasks' files and names (imported only for a job with tasks)."""
    if not spec.benchmarks.tasks:
        return []
    # a job with [benchmarks] tasks only (their YAML files are read)
    from ..core import benchfiles

    return benchfiles.problems(spec.benchmarks, benchmetric.used(spec))


def container_only_paths(spec: specmod.JobSpec) -> list[str]:
    """`data.checks.container_only_paths`: data paths that exist only inside the job's image."""
    if spec.data.source != "files":
        return []
    # data/'s checks only for a job that reads files: `validate` of a synthetic one imports no data/
    from ..data import checks

    return checks.container_only_paths(spec)


def prepared_state(spec: specmod.JobSpec) -> list[str]:
    """`data.checks.prepared_state`: `validate`'s lines on whether the data is prepared."""
    if spec.data.source != "files":
        return []
    # data/'s checks only for a job that reads files: `validate` of a synthetic one imports no data/
    from ..data import checks

    return checks.prepared_state(spec)


def _peft_problems(spec: specmod.JobSpec) -> list[str]:
    """[peft] module names against the model (spec/peft.py): its config, and the tensor names of
    its (resolved, local) weights folder."""
    if spec.peft.method == "none":
        return []
    names = None
    if spec.model.name_or_path:
        try:
            files = modelsource.weight_files(Path(spec.model.name_or_path))
            names = [n for f in files for n in modelsource.safetensors_header(f) if n != "__metadata__"]
        except (OSError, ValueError, KeyError):
            names = None
    return peft.module_problems(spec, modelsource.model_config(spec), names)
