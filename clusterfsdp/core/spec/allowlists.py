"""What may reach a shell line or an `#SBATCH` line from job.toml: the [slurm] values rendered as
sbatch options, [slurm.container] values on the srun line, and the names in [env].

The batch script (`launch.render_sbatch`) quotes every value too; these allowlists keep each value
to what its consumer parses as one value, so quoting is never the only defence.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .schema import LOADER_ENV, ContainerSection, SlurmSection, short

# What may reach an `#SBATCH` line from job.toml. Slurm's own parser honours quotes and backslashes
# inside those lines (a quoted value can smuggle further options in), so each value is held to the
# characters its option needs: names for partition/account/qos, the feature expression syntax for
# constraint, and for `extra` values the characters of node lists, GRES, times, paths and mail
# addresses. No space, quote, backslash, '$', '#', ';' or control character ever passes.
_SBATCH_NAME = r"[A-Za-z0-9_.,-]+"
_SBATCH_CONSTRAINT = r"[A-Za-z0-9_.,&|*()\[\]-]+"
_SBATCH_EXTRA_KEY = r"[a-z][a-z0-9-]*"
_SBATCH_EXTRA_VALUE = r"[A-Za-z0-9_.,:=@%/+*&|()\[\]-]*"


def sbatch_name_error(field: str, value: str) -> str | None:
    """A partition (account, qos) name from another section (data.prepare_partition) held to the
    allowlist of slurm.partition."""
    if value and not re.fullmatch(_SBATCH_NAME, value):
        return f"{field}: {short(value)} may only contain letters, digits, '_', '.', ',' and '-'"
    return None


def sbatch_value_errors(s: SlurmSection) -> list[str]:
    """[slurm] values that would not stay one value on their `#SBATCH` line."""
    errors = []
    for key, pattern, allowed in (
        ("partition", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("account", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("qos", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("constraint", _SBATCH_CONSTRAINT, "feature names and & | * ( ) [ ] ,"),
    ):
        value = getattr(s, key)
        if value and not re.fullmatch(pattern, value):
            errors.append(f"slurm.{key}: {short(value)} may only contain {allowed}")
    for key, value in s.extra.items():
        if not re.fullmatch(_SBATCH_EXTRA_KEY, key):
            errors.append(f"slurm.extra.{key}: not an sbatch option name (lowercase letters, digits, '-')")
        elif managed := managed_option(key):
            errors.append(f"slurm.extra.{key}: {managed}")
        elif isinstance(value, str) and not re.fullmatch(_SBATCH_EXTRA_VALUE, value):
            errors.append(
                f"slurm.extra.{key}: {short(value)} may only contain letters, digits and "
                "_ . , : = @ % / + * & | ( ) [ ] -"
            )
    return errors


# sbatch options clusterfsdp sets itself (launch.sbatch_options, slurmcli.submit) or that would
# change how it submits and follows the job, with what to do instead. `slurm.extra` may not set
# them: a second value would silently win over the managed one (sbatch takes the last).
# `comment` and `exclude` are not here: clusterfsdp merges them with its own.
_MANAGED_SBATCH = {
    "job-name": "set job.name",
    **{key: f"set slurm.{key}" for key in ("nodes", "time", "partition", "account", "qos", "constraint")},
    "time-min": "set slurm.time_min",
    "exclusive": "set slurm.exclusive = true",
    **dict.fromkeys(("requeue", "no-requeue"), "set slurm.requeue"),
    "gpus-per-node": "set slurm.gpus_per_node",
    "cpus-per-task": "set slurm.cpus_per_task",
    "mem": "set slurm.mem_gb",
    "signal": "set slurm.signal_grace_s (the time-limit signal is how workers save in time)",
    **dict.fromkeys(
        ("ntasks", "ntasks-per-node", "tasks-per-node", "ntasks-per-core", "ntasks-per-socket", "ntasks-per-gpu"),
        "one task per GPU is managed: set slurm.tasks_per_node (or gpus_per_node)",
    ),
    "array": "every array task would train into the same run folder; `clusterfsdp sweep JOB --grid KEY=V1,V2` "
    "queues one job array whose tasks each train their own point (docs/sweeps.md)",
    **dict.fromkeys(("export", "export-file"), "[env] and the submitting environment are how variables reach the job"),
    **dict.fromkeys(
        ("output", "error", "open-mode", "input"), "the job's logs are managed (<run folder>/submitit/, logs/)"
    ),
    **dict.fromkeys(
        ("hold", "dependency", "no-kill", "parsable", "wait", "test-only", "wrap"),
        "clusterfsdp submits, holds and chains attempts itself (docs/recovery.md)",
    ),
}
# sbatch options that are a leading part of a managed option's name but an option of their own.
_OWN_OPTIONS = {"gpus"}


def managed_option(key: str) -> str:
    """Why `slurm.extra.<key>` may not be given ('' when it may). sbatch takes an unambiguous
    abbreviation of a long option (`--tim=9` is `--time`), so a leading part of a managed name is
    refused too."""
    if key in _MANAGED_SBATCH:
        return f"managed by clusterfsdp: {_MANAGED_SBATCH[key]}"
    if key not in _OWN_OPTIONS and (name := next((m for m in _MANAGED_SBATCH if m.startswith(key)), None)):
        return f"abbreviates --{name}, which is managed by clusterfsdp: {_MANAGED_SBATCH[name]}"
    return ""


# A `slurm.setup` line runs in the batch script between the `#SBATCH` lines and the job steps;
# sbatch reads directives up to the first command, so a setup line that is one would be obeyed.
_DIRECTIVE = r"(?i)\s*#SBATCH"
_HEREDOC = r"(?<!<)<<(?!<)"


def setup_errors(lines: list[str]) -> list[str]:
    """`slurm.setup` lines that would be `#SBATCH` directives or break the rest of the batch
    script: several lines in one, a here-document (it would swallow the script after it), a
    trailing backslash (it joins the next line), and anything bash cannot parse as a whole
    (unbalanced quotes, `$(`, `if` without `fi`), checked with `bash -n` (parses, runs nothing)."""
    errors = []
    for i, line in enumerate(lines):
        key = f"slurm.setup[{i}]"
        if "\n" in line or "\r" in line:
            errors.append(f"{key}: one shell line per entry (no line breaks)")
        elif re.match(_DIRECTIVE, line):
            errors.append(f"{key}: an #SBATCH directive; give sbatch options in [slurm] or slurm.extra")
        elif re.search(_HEREDOC, line):
            errors.append(f"{key}: a here-document (<<) would read the rest of the batch script; write a file instead")
        elif line.rstrip().endswith("\\"):
            errors.append(f"{key}: a trailing backslash joins the next line of the batch script")
    if errors or not lines:
        return errors
    problem = _bash_syntax_error("\n".join(lines))
    if not problem:
        return []
    at = re.match(r"line (\d+): (.*)", problem)  # bash's line n is entry n - 1
    if at and 1 <= int(at[1]) <= len(lines):
        return [f"slurm.setup[{int(at[1]) - 1}]: bash cannot parse it ({at[2]})"]
    return [f"slurm.setup: bash cannot parse these lines ({problem})"]


def _bash_syntax_error(script: str) -> str:
    """bash's own verdict on `script` (`bash -n`: read and parse, never execute); '' when fine or
    when this host has no bash (the batch host's bash then reports it in the job's log)."""
    bash = shutil.which("bash") or ("/bin/bash" if os.path.exists("/bin/bash") else None)
    if bash is None:
        return ""
    try:
        r = subprocess.run(
            [bash, "--norc", "--noprofile", "-n", "-c", script],
            capture_output=True,
            text=True,
            errors="replace",
            env={"LC_ALL": "C", "PATH": os.defpath},  # no BASH_ENV: nothing is sourced
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if r.returncode == 0:
        return ""
    first = next((line for line in r.stderr.splitlines() if line.strip()), f"exit {r.returncode}")
    return re.sub(r"^.*?-c: ", "", first).strip()[:200]


_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def env_errors(env: dict[str, str], allowed: list[str]) -> list[str]:
    """[env] names that are not environment variable names, or load code without job.allow_env."""
    errors = []
    for key in env:
        if not re.fullmatch(_ENV_NAME, key):
            errors.append(f"env.{key}: not a valid environment variable name")
        elif key in LOADER_ENV and key not in allowed:
            errors.append(
                f"env.{key}: changes which code the workers load; name it in job.allow_env to set it on purpose"
            )
        elif key == "MASTER_PORT" and not (env[key].isdigit() and 1024 <= int(env[key]) <= 65535):
            errors.append(f"env.MASTER_PORT: expected a port number from 1024 to 65535, found {short(env[key])}")
    errors += [
        f"job.allow_env: {short(name)} is not one of {', '.join(LOADER_ENV)}"
        for name in allowed
        if name not in LOADER_ENV
    ]
    return errors


# What may reach the srun line (or the command inside the container) from [slurm.container]. The
# values are shell-quoted there too; these keep them to what each launcher parses as one value
# (pyxis and apptainer split mount lists at ',' and ':').
_IMAGE = r"[A-Za-z0-9._/:@#+~-]+"
MOUNT_PATH = r"/[A-Za-z0-9._/+@%=~-]*"  # no ',' or ':' (they separate mounts and their parts)
_MOUNT = rf"({MOUNT_PATH}):({MOUNT_PATH})(?::[a-z+]+)?"
_OPTION = r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._/:@+,=-]*)?"


def container_errors(c: ContainerSection) -> list[str]:
    """[slurm.container] values each launcher would not parse as one value, or that the kind does not use."""
    key = "slurm.container"
    if c.kind == "none":
        given = [k for k in ("image", "mounts", "workdir", "options") if getattr(c, k)]
        return [f"{key}.{k}: set {key}.kind to run in a container" for k in given]
    errors = []
    if not c.image:
        errors.append(
            f"{key}.image: kind = {c.kind!r} needs an image" + (" (the bundle folder)" if c.kind == "oci" else "")
        )
    elif not re.fullmatch(MOUNT_PATH if c.kind == "oci" else _IMAGE, c.image):
        want = (
            "an absolute path of letters, digits and . _ / + @ % = ~ -"
            if c.kind == "oci"
            else ("letters, digits and . _ / : @ # + ~ -")
        )
        errors.append(f"{key}.image: {short(c.image)} must be {want}")
    if not re.fullmatch(r"[A-Za-z0-9._/+-]+", c.python):
        errors.append(f"{key}.python: {short(c.python)} must be a program name or path (letters, digits, . _ / + -)")
    for i, mount in enumerate(c.mounts):
        if not re.fullmatch(_MOUNT, mount):
            errors.append(
                f"{key}.mounts[{i}]: {short(mount)} must be '/SRC:/DST' or '/SRC:/DST:FLAGS' (absolute "
                "paths without ',' or ':'; flags like ro)"
            )
    if c.workdir and not re.fullmatch(MOUNT_PATH, c.workdir):
        errors.append(f"{key}.workdir: {short(c.workdir)} must be an absolute path of letters, digits and . _ / + -")
    for i, option in enumerate(c.options):
        if not re.fullmatch(_OPTION, option):
            errors.append(f"{key}.options[{i}]: {short(option)} must be one --option or --option=value")
    if c.kind == "oci":
        errors += [
            f"{key}.{k}: not used with kind = 'oci' (the bundle's config.json sets it)"
            for k in ("mounts", "workdir", "options")
            if getattr(c, k)
        ]
    return errors
