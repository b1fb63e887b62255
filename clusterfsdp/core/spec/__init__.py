"""The job spec: typed dataclasses for every section of job.toml, loading with field-level
errors, command-line overrides, cross-field checks and TOML output.

Everything here is pure Python (no torch), so `validate`, `init` and the TUI's compose form stay
fast. One module per concern:
- `schema`: `JobSpec` and its derived facts, over the sections' dataclasses (one per `[section]`,
  every field with its docstring, `docfield.F`) in `slurmsection`, `datasection`, `trainsection`,
  `outputsection` and `benchsection`;
- `codec`: TOML data <-> JobSpec (`coerce`, `from_dict`, `loads`, `--set` overrides, `dumps`,
  `render_value`);
- `crossfield`: cross-field checks; `allowlists`: what may reach a shell or `#SBATCH` line;
- `paths`: job files, absolute paths, hub ids; `tokenizer`: what data.tokenizer = 'auto' is;
- `docs`: `clusterfsdp schema`, `init`'s starter file, completion's key list.
Import the names from here (`from clusterfsdp.core.spec import JobSpec`).
"""

from .allowlists import MOUNT_PATH
from .codec import (
    apply_overrides,
    coerce,
    dumps,
    from_dict,
    key_type,
    loads,
    plain,
    render_key,
    render_value,
    secret_env,
    to_dict,
    unknown_key_line,
)
from .crossfield import budget_refusal, check, sweep_budget_refusal
from .docs import describe_schema, key_paths, starter_toml
from .nodes import NodeRange
from .paths import JobText, load, looks_like_hub_id, read_job_file, with_absolute_paths
from .schema import (
    SECTIONS,
    CheckpointSection,
    ContainerSection,
    DataSection,
    DataSource,
    EvalSection,
    F,
    FsdpSection,
    JobSection,
    JobSpec,
    LogSection,
    ModelSection,
    PeftSection,
    SlurmSection,
    SpecError,
    Tracker,
    TrainSection,
    parse_time_minutes,
    section_class,
    section_fields,
    toml_key,
    type_name,
)
from .tokenizer import TOKENIZER_MARKERS, chat_problem, default_tokenizer, has_tokenizer

__all__ = [
    "MOUNT_PATH",
    "SECTIONS",
    "TOKENIZER_MARKERS",
    "CheckpointSection",
    "ContainerSection",
    "DataSection",
    "DataSource",
    "EvalSection",
    "F",
    "FsdpSection",
    "JobSection",
    "JobSpec",
    "JobText",
    "LogSection",
    "ModelSection",
    "NodeRange",
    "PeftSection",
    "SlurmSection",
    "SpecError",
    "Tracker",
    "TrainSection",
    "apply_overrides",
    "budget_refusal",
    "chat_problem",
    "check",
    "coerce",
    "default_tokenizer",
    "describe_schema",
    "dumps",
    "from_dict",
    "has_tokenizer",
    "key_paths",
    "key_type",
    "load",
    "loads",
    "looks_like_hub_id",
    "parse_time_minutes",
    "plain",
    "read_job_file",
    "render_key",
    "render_value",
    "secret_env",
    "section_class",
    "section_fields",
    "starter_toml",
    "sweep_budget_refusal",
    "to_dict",
    "toml_key",
    "type_name",
    "unknown_key_line",
    "with_absolute_paths",
]
