"""A job's inputs checked before queueing (submit, resume) and for `validate`: the model's and the
tokenizer's sources resolved and checked (`modelsource`), then the data read (`data.checks`).
Apart from the run service so that `validate` imports only this, not the submit machinery (run,
backends, launch, lock): start-up is paid on every call (issue 25 item 3)."""

from __future__ import annotations

from ..data import checks as datachecks
from . import hub, modelsource
from . import spec as specmod


def prepare_sources(spec: specmod.JobSpec, mode: hub.Mode = "download") -> modelsource.Prepared:
    """After the cheap checks: hub ids resolved (submit: a missing snapshot downloaded here, never
    on the compute nodes; validate: mode 'check'), the model and tokenizer folders checked, then
    the data sources read (readable, not smaller than a batch; they may need the resolved
    tokenizer). SpecError with every problem."""
    prepared = modelsource.prepare(spec, mode)
    problems = datachecks.problems(prepared.spec)
    if problems:
        raise specmod.SpecError(problems)
    return prepared
