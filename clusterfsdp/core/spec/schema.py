"""The job spec's schema: `JobSpec`, one typed dataclass per `[section]` of job.toml, and the
facts derived from it (world size, mesh shape, time limit in minutes).

The sections are defined by what they say about a job, one module each: `slurmsection`
([job], [slurm], [slurm.container]), `datasection` ([model], [data], [eval]), `trainsection`
([train] and its tables, [fsdp], [peft]), `outputsection` ([checkpoint], [log], [sweep]) and
`benchsection` ([benchmarks]); their fields are made with `docfield.F`, which carries each
field's docstring in `metadata["doc"]`: `clusterfsdp schema`, the starter file of
`clusterfsdp init` and the TUI's compose form are generated from it (`docs.py`), so the
documentation cannot drift from the code. Every name is importable from here as before.

Also here: the lookups the codec, the checks and the docs share (TOML key of a field,
annotation of a section's field, the names of types and values in error lines). Pure Python:
no torch.
"""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

import dataclasses
import functools
import re
import types
import typing
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from ..errors import UserError
from ..value import value
from .benchsection import BenchmarksSection
from .datasection import MAX_PREPARE_WORKERS, DataSection, DataSource, EvalSection, ModelSection
from .docfield import F
from .nodes import NodeRange, grad_accum_at
from .nodes import parse as parse_nodes
from .outputsection import MAX_SWEEP_POINTS, MAX_WRITER_THREADS, CheckpointSection, LogSection, SweepSection, Tracker
from .slurmsection import LOADER_ENV, MAX_TASKS_PER_NODE, ContainerSection, JobSection, SlurmSection
from .trainsection import (
    OBJECTIVES,
    TWO_ROWS,
    EarlyStopping,
    FsdpSection,
    Guard,
    PeftSection,
    Preference,
    TrainSection,
    Watchdog,
)

__all__ = [  # the sections' names, imported from here by the rest of the package (and tests)
    "LOADER_ENV",
    "MAX_PREPARE_WORKERS",
    "MAX_SWEEP_POINTS",
    "MAX_TASKS_PER_NODE",
    "MAX_WRITER_THREADS",
    "OBJECTIVES",
    "SECTIONS",
    "TWO_ROWS",
    "BenchmarksSection",
    "CheckpointSection",
    "ContainerSection",
    "DataSection",
    "DataSource",
    "EarlyStopping",
    "EvalSection",
    "F",
    "FsdpSection",
    "Guard",
    "JobSection",
    "JobSpec",
    "LogSection",
    "ModelSection",
    "PeftSection",
    "Preference",
    "SlurmSection",
    "SpecError",
    "SweepSection",
    "Tracker",
    "TrainSection",
    "Watchdog",
    "closest",
    "describe_value",
    "hints",
    "parse_time_minutes",
    "section_class",
    "section_fields",
    "short",
    "toml_key",
    "type_name",
]


class SpecError(UserError, ValueError):
    """A job spec that cannot be used. `errors` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


@value
class JobSpec:
    """A whole job.toml, typed: one field per section, and the facts derived from them."""

    job: JobSection = field(default_factory=JobSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    fsdp: FsdpSection = field(default_factory=FsdpSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    peft: PeftSection = field(default_factory=PeftSection)
    benchmarks: BenchmarksSection = field(default_factory=BenchmarksSection)
    env: dict[str, str] = field(
        default_factory=dict,
        metadata={"doc": "Extra environment for the workers; overrides everything clusterfsdp sets (NCCL_*, etc.)."},
    )

    # ---- derived facts (used by validate, the sbatch renderer and the worker)
    @property
    def tasks_per_node(self) -> int:
        s = self.slurm
        return s.tasks_per_node or s.gpus_per_node or 1

    @property
    def node_range(self) -> NodeRange:
        """slurm.nodes parsed: a count is a range of one size (ValueError for a spec that was not checked).
        `high` is the size the global batch is defined at, `low` what node exclusions must leave."""
        return parse_nodes(self.slurm.nodes)

    def needs_slurm(self) -> str:
        """'slurm.nodes = N needs Slurm' when the job spans more than one node (the largest of a
        range), else '': without Slurm (the local executor, a notebook's local ranks) every rank
        runs on this one machine. The one statement of the rule: validate's and the TUI's
        summaries say it, the local backends refuse with it (`backends.Local`, `LocalRanks`)."""
        return f"slurm.nodes = {self.slurm.nodes} needs Slurm" if self.node_range.high > 1 else ""

    @property
    def world_size(self) -> int:
        """Ranks at the largest size (an elastic attempt's are its own: `on_nodes`)."""
        return self.node_range.high * self.tasks_per_node

    @property
    def effective_sharding(self) -> str:
        """`hybrid` on one node is plain `full` sharding (nothing to replicate across)."""
        if self.fsdp.sharding == "hybrid" and self.node_range.high == 1:
            return "full"
        return self.fsdp.sharding

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """(replicate, shard) for hybrid, (world,) otherwise."""
        if self.effective_sharding == "hybrid":
            return (self.node_range.high, self.tasks_per_node)
        return (self.world_size,)

    def grad_accum_at(self, nodes: int) -> int | None:
        """train.grad_accum on `nodes` nodes with the same global batch (None: no whole number)."""
        return grad_accum_at(self.node_range, self.train.grad_accum, nodes)

    def on_nodes(self, nodes: int) -> "JobSpec":
        """This spec as an attempt on `nodes` nodes of its range runs it: slurm.nodes = `nodes`
        and the grad_accum that keeps the global batch (ValueError outside the range, or where
        no whole grad_accum does: validate refuses such ranges)."""
        accum = self.grad_accum_at(nodes)
        if nodes not in self.node_range.sizes or accum is None:
            raise ValueError(
                f"the allocation has {nodes} node(s), which slurm.nodes = {self.slurm.nodes!r} does not allow with "
                f"the global batch {self.global_batch}"
            )
        return dataclasses.replace(
            self,
            slurm=dataclasses.replace(self.slurm, nodes=nodes),
            train=dataclasses.replace(self.train, grad_accum=accum),
        )

    @property
    def base_dtype(self) -> str:
        """The dtype of the weights that do not train: peft.base_dtype for a LoRA job that sets it,
        else model.dtype (every weight of a full fine-tune)."""
        return (self.peft.method == "lora" and self.peft.base_dtype) or self.model.dtype

    @property
    def packing(self) -> str:
        """data.packing with 'auto' decided: 'documents' for chat data (any chat source), else 'concat'."""
        if self.data.format in TWO_ROWS or any(s.format in TWO_ROWS for s in self.data.sources):
            return "pairs"  # one sample is one pair (its answers) or one unpaired example (+ its KL row) in two rows
        if self.data.packing == "auto":
            chat = self.data.format == "chat" or any(s.format == "chat" for s in self.data.sources)
            return "documents" if chat else "concat"
        return self.data.packing

    @property
    def preference_training(self) -> bool:
        """A preference objective (train.objective other than 'sft'): pairs in, rewards out."""
        return self.train.objective != "sft"

    @property
    def eval_enabled(self) -> bool:
        return self.data.source == "files" and (self.eval.fraction > 0 or bool(self.eval.paths))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.world_size * self.train.micro_batch_size * self.train.grad_accum

    @property
    def time_minutes(self) -> int:
        return parse_time_minutes(self.slurm.time)

    def notices(self) -> list[str]:
        """Non-fatal facts the user should see before queueing."""
        out = []  # (not 'hybrid' on 1 node: the default on one node, validate's mesh line says 'full')
        if self.slurm.gpus_per_node == 0 and self.fsdp.mixed_precision != "fp32":
            out.append(
                f"no GPUs: mixed_precision = '{self.fsdp.mixed_precision}' runs on CPU (slow); fp32 is usual there."
            )
        if self.slurm.gpus_per_node == 0 and self.fsdp.cpu_offload and self.fsdp.version == 1:
            out.append("no GPUs: FSDP1 keeps its parameters in host memory anyway; fsdp.cpu_offload changes nothing.")
        return out


SECTIONS: dict[str, type] = {f.name: f.type for f in dataclasses.fields(JobSpec)}  # type: ignore[misc]


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a schema dataclass, per field name; resolved when first asked
    (the codec asks only for the sections a job file has): start-up is paid on every call."""
    return typing.get_type_hints(cls)


def toml_key(f: dataclasses.Field) -> str:
    """The key a field is written with in job.toml (`async_` is `async`)."""
    return f.metadata.get("key") or f.name


def section_fields(section: str) -> dict[str, dataclasses.Field]:
    """TOML key -> dataclass field for one section."""
    cls = section_class(section)
    return {toml_key(f): f for f in dataclasses.fields(cls)}


def section_class(section: str) -> type:
    """The dataclass of one section (`slurm` -> SlurmSection); [env] is a plain table and has none."""
    return {f.name: hints(JobSpec)[f.name] for f in dataclasses.fields(JobSpec) if f.name != "env"}[section]


def type_name(tp: Any) -> str:
    """An annotation as the docs and error lines name it ('integer', "'a' | 'b'", 'list of string')."""
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in get_args(tp))
    if origin is list:
        return f"list of {type_name(get_args(tp)[0])}"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "table"
    if tp is Any:
        return "any value"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, str(tp))


def closest(word: str, choices: list[str]) -> str | None:
    """The choice closest to a mistyped word, if any is close (difflib is imported here, not at
    start-up: only an error line needs it)."""
    # only when an error suggests a name (start-up of `validate`, issue 25 item 3)
    import difflib

    close = difflib.get_close_matches(word, choices, n=1)
    return close[0] if close else None


def describe_value(value: Any) -> str:
    """A value as error lines name it: its TOML kind and its repr, cut at 40 characters."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__
    )
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def short(value: str) -> str:
    """A string as error lines quote it, cut at 40 characters (values may be long or hostile)."""
    return repr(value if len(value) <= 40 else value[:37] + "...")


_TIME = r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$"


def parse_time_minutes(value: int | str) -> int:
    """Slurm time limit -> whole minutes (rounded up), accepting every form sbatch accepts."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"must be a positive number of minutes, found {value}")
        return value
    m = re.match(_TIME, value.strip())
    if not m:
        raise ValueError(f"expected minutes or 'D-HH:MM:SS' (or MM:SS, HH:MM:SS, D-HH, D-HH:MM), found {value!r}")
    d, a, b, c = (int(x) if x else None for x in m.group("d", "a", "b", "c"))
    assert a is not None  # the pattern requires it
    if d is None:  # MM | MM:SS | HH:MM:SS
        if b is None:
            secs = a * 60
        elif c is None:
            secs = a * 60 + b
        else:
            secs = a * 3600 + b * 60 + c
    else:  # D-HH | D-HH:MM | D-HH:MM:SS
        secs = d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if secs <= 0:
        raise ValueError(f"must be positive, found {value!r}")
    return -(-secs // 60)
