"""The one rule for secrets in `[env]`. An entry is a secret when its name says so or its value
does. Its value travels only in the environment of the submitting process (sbatch exports it;
the local executor inherits it) and is replaced by REDACTED in every file clusterfsdp writes: the
run's job.toml, each checkpoint's copy of it, node records, status and the TUI. A resume needs
the values in its own environment again.

The name is judged by its words (split at `_`, `-`, `.`), not by substrings: a substring rule
redacts TOKENIZERS_PARALLELISM, NCCL_IB_PKEY or AUTHOR_NAME, and a redacted harmless variable then
blocks `resume` until the user exports it. A name is secret when it starts with SESSION
(SESSION_ID, SESSIONKEY; XDG_SESSION_TYPE is not) or a word is one of SECRET_WORDS (MYSQL_PWD,
GITHUB_PAT, AWS_CREDS, CLIENT_PEM, ...), starts with one of SECRET_PREFIXES (COOKIES, PASSWORDS) or
ends with one of SECRET_SUFFIXES (APIKEY, HFTOKEN, DBPASSWORD). A value is
secret when it holds one of SECRET_VALUES (a URL with a password, `scheme://user:pass@host`:
DATABASE_URL, SENTRY_DSN, MLFLOW_TRACKING_URI; a PEM block; a key of an Azure connection string,
`AccountKey=`; a Slack or Discord webhook URL, whose path is its credential) or starts like a
well-known token (hf_, ghp_, sk-, AKIA, ...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_WORDS = frozenset(
    ("KEY", "KEYS", "APIKEY", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASS", "PASSWD", "PASSWORD", "PASSPHRASE",
     "PWD", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "PRIVATE", "PAT", "COOKIE", "COOKIES", "PEM", "DSN")
)  # fmt: skip
SECRET_PREFIXES = ("COOKIE", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "PRIVATEKEY")
SECRET_SUFFIXES = ("APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")
_WORD_SPLIT = r"[_\-.]+"
# What in a value carries a credential, wherever it is in the value.
SECRET_VALUES = (
    # scheme://user:password@host (the password may be empty only if the colon is there: user:@host is not)
    r"(?i)[a-z][a-z0-9+.\-]*://[^/\s:@]*:[^/\s@]+@",
    r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----",
    # Azure: storage connection strings (AccountKey), Service Bus / Event Hubs (SharedAccessKey), SAS
    r"(?i)(^|;)\s*(AccountKey|SharedAccessKey|SharedAccessSignature)\s*=",
    r"(?i)https://hooks\.slack\.com/(services|workflows|triggers)/",  # a webhook's URL is its credential
    r"(?i)https://(\w+\.)?discord(app)?\.com/api/webhooks/",
)
_KNOWN_TOKEN = r"(hf_|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|sk-|xox[abpr]-|AKIA)[A-Za-z0-9_\-]{16,}"
REDACTED = "<redacted: taken from the submitting environment>"


def secret_name(name: str) -> bool:
    words = [w for w in re.split(_WORD_SPLIT, name.upper()) if w]
    return name.upper().startswith("SESSION") or any(
        w in SECRET_WORDS or w.startswith(SECRET_PREFIXES) or w.endswith(SECRET_SUFFIXES) for w in words
    )


def secret_value(value: str) -> bool:
    return any(re.search(pattern, value) for pattern in SECRET_VALUES) or bool(re.match(_KNOWN_TOKEN, value.strip()))


def is_secret(name: str, value: str = "") -> bool:
    return secret_name(name) or secret_value(value)


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as it may be written to a file."""
    return {k: (REDACTED if is_secret(k, v) else v) for k, v in env.items()}


def values(env: Mapping[str, str]) -> dict[str, str]:
    """The secret entries whose values are known here (not already redacted)."""
    return {k: v for k, v in env.items() if v != REDACTED and is_secret(k, v)}


def missing(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Redacted secrets (a stored job.toml) whose values this process's environment lacks."""
    environ = os.environ if environ is None else environ
    return sorted(k for k, v in env.items() if v == REDACTED and k not in environ)
