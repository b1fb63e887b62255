"""What may reach a shell line or an `#SBATCH` line from job.toml: the [slurm] values rendered as
sbatch options, [slurm.container] values on the srun line, and the names in [env].

The batch script (`launch.render_sbatch`) quotes every value too; these allowlists keep each value
to what its consumer parses as one value, so quoting is never the only defence.
"""

from __future__ import annotations

import re

from .schema import ContainerSection, SlurmSection, short

# What may reach an `#SBATCH` line from job.toml. Slurm's own parser honours quotes and backslashes
# inside those lines (a quoted value can smuggle further options in), so each value is held to the
# characters its option needs: names for partition/account/qos, the feature expression syntax for
# constraint, and for `extra` values the characters of node lists, GRES, times, paths and mail
# addresses. No space, quote, backslash, '$', '#', ';' or control character ever passes.
_SBATCH_NAME = re.compile(r"[A-Za-z0-9_.,-]+")
_SBATCH_CONSTRAINT = re.compile(r"[A-Za-z0-9_.,&|*()\[\]-]+")
_SBATCH_EXTRA_KEY = re.compile(r"[a-z][a-z0-9-]*")
_SBATCH_EXTRA_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%/+*&|()\[\]-]*")


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
        if value and not pattern.fullmatch(value):
            errors.append(f"slurm.{key}: {short(value)} may only contain {allowed}")
    for key, value in s.extra.items():
        if not _SBATCH_EXTRA_KEY.fullmatch(key):
            errors.append(f"slurm.extra.{key}: not an sbatch option name (lowercase letters, digits, '-')")
        elif isinstance(value, str) and not _SBATCH_EXTRA_VALUE.fullmatch(value):
            errors.append(
                f"slurm.extra.{key}: {short(value)} may only contain letters, digits and "
                "_ . , : = @ % / + * & | ( ) [ ] -"
            )
    return errors


# What may reach the srun line (or the command inside the container) from [slurm.container]. The
# values are shell-quoted there too; these keep them to what each launcher parses as one value
# (pyxis and apptainer split mount lists at ',' and ':').
_IMAGE = re.compile(r"[A-Za-z0-9._/:@#+~-]+")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/+@%=~-]*")  # no ',' or ':' (they separate mounts and their parts)
_MOUNT = re.compile(rf"({MOUNT_PATH.pattern}):({MOUNT_PATH.pattern})(?::[a-z+]+)?")
_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._/:@+,=-]*)?")


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
    elif not (MOUNT_PATH if c.kind == "oci" else _IMAGE).fullmatch(c.image):
        want = (
            "an absolute path of letters, digits and . _ / + @ % = ~ -"
            if c.kind == "oci"
            else ("letters, digits and . _ / : @ # + ~ -")
        )
        errors.append(f"{key}.image: {short(c.image)} must be {want}")
    if not re.fullmatch(r"[A-Za-z0-9._/+-]+", c.python):
        errors.append(f"{key}.python: {short(c.python)} must be a program name or path (letters, digits, . _ / + -)")
    for i, mount in enumerate(c.mounts):
        if not _MOUNT.fullmatch(mount):
            errors.append(
                f"{key}.mounts[{i}]: {short(mount)} must be '/SRC:/DST' or '/SRC:/DST:FLAGS' (absolute "
                "paths without ',' or ':'; flags like ro)"
            )
    if c.workdir and not MOUNT_PATH.fullmatch(c.workdir):
        errors.append(f"{key}.workdir: {short(c.workdir)} must be an absolute path of letters, digits and . _ / + -")
    for i, option in enumerate(c.options):
        if not _OPTION.fullmatch(option):
            errors.append(f"{key}.options[{i}]: {short(option)} must be one --option or --option=value")
    if c.kind == "oci":
        errors += [
            f"{key}.{k}: not used with kind = 'oci' (the bundle's config.json sets it)"
            for k in ("mounts", "workdir", "options")
            if getattr(c, k)
        ]
    return errors
