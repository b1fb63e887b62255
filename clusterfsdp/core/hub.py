"""HuggingFace Hub ids -> local snapshot folders, on the submitting host.

Compute nodes never download: `submit` resolves every hub id in the job (a model, a tokenizer,
a dataset) to the snapshot folder in the HF cache (`HF_HOME`, on a cluster a folder on the
shared filesystem), downloading it first when the host can reach the hub, and the run's job.toml
records that folder and the commit it holds. The cache layout is huggingface_hub's own
(`<cache>/<type>s--<org>--<name>/snapshots/<commit>/`), read through `snapshot_download`, so
HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN mean what they mean everywhere else.

No torch here: huggingface_hub is a pure-Python client.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Literal

from . import ownership
from .errors import UserError
from .value import value

RepoType = Literal["model", "dataset"]
# How hard to try: download what is missing (submit), ask the hub whether an uncached id exists
# without downloading it (validate), or look at the local cache only (the TUI, on every keystroke).
Mode = Literal["download", "check", "cache"]

# huggingface_hub's rule for repo ids: [org/]name, letters, digits, '-', '_', '.', no '--' or '..'.
_REPO_ID = r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$"
_COMMIT = r"^[0-9a-f]{40}$"


class HubError(UserError):
    """A hub id that cannot be resolved; the message is one line and says how to fetch it."""


@value(frozen=True)
class Snapshot:
    """Where a hub id lives on this host. `path` is None when it is not cached and was not fetched
    (modes 'check' and 'cache'); `note` then says what submit will do."""

    repo_id: str
    repo_type: RepoType
    revision: str  # the commit the snapshot holds ("" when not cached)
    path: str | None
    note: str = ""


def looks_like_repo_id(text: str) -> bool:
    """True for 'org/name' or 'name' shapes that are not local paths ('./x', '/x', '~/x')."""
    return bool(re.match(_REPO_ID, text)) and "--" not in text and ".." not in text and not text.endswith(".")


def cache_dir() -> str:
    # huggingface_hub (heavy: requests, tqdm, ...) only for a hub id
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def fetch_command(repo_id: str, repo_type: RepoType = "model", revision: str = "") -> str:
    """The shell command that puts the repo into the HF cache of the current HF_HOME."""
    argv = ["hf", "download", repo_id]
    if repo_type != "model":
        argv += ["--repo-type", repo_type]
    if revision:
        argv += ["--revision", revision]
    return shlex.join(argv)


def resolve(
    repo_id: str,
    repo_type: RepoType = "model",
    revision: str = "",
    *,
    mode: Mode = "download",
    allow_patterns: list[str] | None = None,
) -> Snapshot:
    """The local snapshot of `repo_id` at `revision` (default branch when empty).

    A commit hash, offline mode (HF_HUB_OFFLINE=1) and the modes 'check'/'cache' look in the
    cache first; a branch or tag in 'download' mode asks the hub which commit it names (and
    falls back to the cached snapshot when the hub cannot be reached)."""
    # huggingface_hub (heavy: requests, tqdm, ...) only for a hub id
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = bool(constants.HF_HUB_OFFLINE)

    def download(local_only: bool) -> Snapshot:
        path = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision or None,
            allow_patterns=allow_patterns,
            local_files_only=local_only,
        )
        problem = _foreign(Path(str(path)))
        if problem:
            raise HubError(
                f"{problem}: refusing to use {repo_id!r} from {where}; set ${ownership.ENV_TRUSTED_GROUP} to share "
                "a team's cache, or point HF_HOME at a cache of your own"
            )
        return Snapshot(repo_id, repo_type, Path(str(path)).name, str(path))  # …/snapshots/<commit>

    fetch = fetch_command(repo_id, repo_type, revision)
    where = f"the HF cache ({cache_dir()})"
    try:
        if offline or mode != "download" or re.match(_COMMIT, revision):
            try:
                return download(local_only=True)
            except LocalEntryNotFoundError:
                if offline:
                    raise HubError(
                        f"{repo_id!r} is not in {where} and HF_HUB_OFFLINE=1 forbids downloading; "
                        f"fetch it with: {fetch}"
                    ) from None
                if mode == "cache":
                    return Snapshot(repo_id, repo_type, "", None, f"{repo_id!r} is not in {where}: submit downloads it")
                if mode == "check":
                    return _check_remote(repo_id, repo_type, revision, where, fetch)
        return download(local_only=False)
    except GatedRepoError:
        raise HubError(f"{repo_id!r} is gated: accept its terms on the hub and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise HubError(f"no {repo_type} repo {repo_id!r} on the hub (or it is private: hf auth login)") from None
    except RevisionNotFoundError:
        raise HubError(f"{repo_id!r} has no revision {revision!r}") from None
    except LocalEntryNotFoundError as e:
        reason = " ".join(str(e).split())[:160]
        raise HubError(
            f"{repo_id!r} is not in {where} and the hub cannot be reached ({reason}); fetch it with: {fetch}"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise HubError(
            f"{repo_id!r}: {type(e).__name__}: {' '.join(str(e).split())[:200]}; fetch it with: {fetch}"
        ) from None


def _foreign(snapshot: Path) -> str | None:
    """A shared HF cache (HF_HOME on the cluster's filesystem) is written by whoever downloads
    first: the repo's folder, its snapshot, and every file of it (a link into blobs/) and its blob
    must be yours or the trusted group's (`ownership`), else another user chose the weights and
    the tokenizer (and, with trust_remote_code, the code) you train with."""
    repo = snapshot.parent.parent
    for path in (repo, snapshot.parent, snapshot):
        found = ownership.path_clause(path)
        if found:
            return found[1]
    for folder, dirs, files in os.walk(snapshot):  # (links to folders are not followed, but checked)
        for name in (*dirs, *files):
            found = ownership.path_clause(os.path.join(folder, name))
            if found:
                return found[1]
    return None


def _check_remote(repo_id: str, repo_type: RepoType, revision: str, where: str, fetch: str) -> Snapshot:
    """An uncached id: ask the hub whether it exists (no download)."""
    # huggingface_hub (heavy: requests, tqdm, ...) only for a hub id
    from huggingface_hub import HfApi

    try:
        info = HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision or None, timeout=10)
    except Exception as e:  # any failure means the job could not get the files either
        reason = " ".join(str(e).split())[:160]
        raise HubError(
            f"{repo_id!r} is not in {where} and the hub cannot confirm it ({type(e).__name__}: {reason}); "
            f"fetch it with: {fetch}"
        ) from None
    return Snapshot(repo_id, repo_type, "", None, f"{repo_id!r} ({info.sha}) is not in {where}: submit downloads it")
