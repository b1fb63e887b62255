"""The secret rule of `[env]` (core/secretenv.py, issue 29.6), table-driven: every name or
value that carries a credential is redacted from the files clusterfsdp writes, and harmless
variables that merely contain KEY, TOKEN or AUTH are not (a redacted harmless variable blocks
`resume` until the user exports it)."""

from __future__ import annotations

import json

import pytest

from clusterfsdp.core import secretenv
from clusterfsdp.core import spec as S

SECRET_NAMES = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "MYSQL_PWD", "PGPASSWORD", "DB_PASS", "GITHUB_PAT", "GITLAB_PAT", "AWS_CREDS", "GOOGLE_APPLICATION_CREDENTIALS",
    "COOKIE", "HTTP_COOKIE", "SESSION", "SESSION_ID", "SESSIONKEY", "CLIENT_PEM", "TLS_KEY_PEM", "APIKEY",
    "OPENAI_APIKEY", "HFTOKEN", "SSH_PRIVATE_KEY", "BASIC_AUTH", "SENTRY_DSN", "mlflow_tracking_password",
]  # fmt: skip
HARMLESS_NAMES = [
    "TOKENIZERS_PARALLELISM", "NCCL_IB_PKEY", "AUTHOR_NAME", "NCCL_DEBUG", "OMP_NUM_THREADS", "HF_HOME",
    "KEYBOARD_LAYOUT", "PASSAGE_COUNT", "XDG_SESSION_TYPE", "MONKEY_PATCH", "PATH_PREFIX", "TORCH_COMPILE_DEBUG",
]  # fmt: skip
SECRET_VALUES = [
    ("DATABASE_URL", "postgresql://trainer:hunter2@db.internal:5432/runs"),
    ("SENTRY_URL", "https://public:secret@sentry.example.org/1"),  # (a name with DSN is secret by name)
    ("MLFLOW_TRACKING_URI", "https://alice:s3cret@mlflow.example.org"),
    ("REDIS", "redis://:onlypass@cache:6379/0"),
    ("SOME_VAR", "hf_abcdefghijklmnopqrstuvwxyz012345"),
    ("OTHER", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
    ("CERT", "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----"),
    ("AZURE_STORAGE", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bXlrZXk=;EndpointSuffix=x.net"),
    ("BLOB", "AccountKey=bXlrZXk=;AccountName=acct"),
    ("BUS", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=abc123="),
    ("NOTIFY_URL", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"),
    ("ALERTS", "https://hooks.slack.com/workflows/T00000000/A00000000/123/abc"),
    ("CHAT", "https://discord.com/api/webhooks/123456/abcdef"),
]
HARMLESS_VALUES = [
    ("MLFLOW_TRACKING_URI", "https://mlflow.example.org:5000/path"),
    ("DATABASE_URL", "sqlite:////tmp/runs.db"),
    ("GIT_REMOTE", "ssh://git@github.com/org/repo.git"),
    ("NOTE", "sk-"),
    ("TIME", "12:30@noon"),
    ("AZURE_ACCOUNT", "DefaultEndpointsProtocol=https;AccountName=acct;EndpointSuffix=core.windows.net"),
    ("DOCS", "https://api.slack.com/messaging/webhooks"),
    ("NOTE", "rotate the AccountKey monthly"),
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_redacted(name):
    assert secretenv.is_secret(name, "value")
    assert secretenv.redacted({name: "value"}) == {name: secretenv.REDACTED}


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_names_are_kept(name):
    assert not secretenv.is_secret(name, "1")
    assert secretenv.redacted({name: "1"}) == {name: "1"}


@pytest.mark.parametrize(("name", "value"), SECRET_VALUES)
def test_values_that_carry_a_credential_are_redacted(name, value):
    """Judged by the value alone (the names are harmless): the job.toml a run folder gets holds
    the placeholder instead, while the value still reaches the workers' environment."""
    assert not secretenv.secret_name(name) and secretenv.is_secret(name, value)
    assert secretenv.redacted({name: value, "NCCL_DEBUG": "INFO"}) == {name: secretenv.REDACTED, "NCCL_DEBUG": "INFO"}
    spec = S.loads(f"[env]\n{name} = {json.dumps(value)}\n")
    written = S.dumps(spec, redact=True)
    assert all(line not in written for line in value.splitlines()), written
    assert S.loads(written).env == {name: secretenv.REDACTED}
    assert S.secret_env(spec) == {name: value}  # (exported to the workers by the submitting process)


@pytest.mark.parametrize(("name", "value"), HARMLESS_VALUES)
def test_values_without_a_credential_are_kept(name, value):
    assert not secretenv.is_secret(name, value)


def test_a_written_job_keeps_harmless_variables_so_resume_does_not_ask_for_them():
    spec = S.loads(
        '[env]\nTOKENIZERS_PARALLELISM = "false"\nNCCL_IB_PKEY = "0x8001"\nAUTHOR_NAME = "ada"\n'
        'MYSQL_PWD = "pw1"\nDATABASE_URL = "mysql://u:pw2@db/x"\n'
    )
    written = S.loads(S.dumps(spec, redact=True))
    assert "pw1" not in S.dumps(spec, redact=True) and "pw2" not in S.dumps(spec, redact=True)
    assert secretenv.missing(written.env, environ={}) == ["DATABASE_URL", "MYSQL_PWD"]
    assert written.env["TOKENIZERS_PARALLELISM"] == "false" and written.env["AUTHOR_NAME"] == "ada"
