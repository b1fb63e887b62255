"""A shared cluster, second round (issue 34): what another user created in a shared place is never
executed, unpickled, deleted through or trained on. A real second local user (tests/users.py)
plants the files; the commands run as the test's user (root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tui_helpers import make_run

BIN = str(Path(sys.executable).parent)  # the venv's `clusterfsdp` script, which the completion calls


def _completion(shell: str, words: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "completion", shell], capture_output=True, text=True, check=True
    ).stdout
    line = " ".join(f"'{w}'" for w in words)
    setup = f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}"
    call = '_clusterfsdp; printf "%s\\n" "${COMPREPLY[@]}"'
    if shell == "zsh":
        call = f"compgen -F _clusterfsdp -- '{words[-1]}'"
    return subprocess.run(
        [shell, "-c", f"{setup}\n{call}"], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_completing_a_run_id_never_runs_a_planted_folder_name(tmp_path, other_user, shared_root):
    """Reproduced: `compgen -W "$(clusterfsdp runs --quiet)"` expanded a run folder named
    `$(touch ...)`, running it as whoever pressed TAB (root). Both shells, both expansions
    (command substitution and backquotes); the real ids still complete."""
    staging = tmp_path / "staging"
    mine = make_run(shared_root, "20260101-120000-aaaa")
    proofs = [tmp_path / "pwned-dollar", tmp_path / "pwned-backquote"]  # the shells run in tmp_path
    for name in (f"$(touch {proofs[0].name})", f"`touch {proofs[1].name}`"):
        make_run(staging, name, name="planted")
    other_user.plant_copy(staging / "planted", shared_root)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CLUSTERFSDP_RUN_ROOT": str(shared_root)}
    listed = subprocess.run(
        [sys.executable, "-m", "clusterfsdp", "runs", "--quiet"], capture_output=True, text=True, env=env
    ).stdout
    assert "$(touch" in listed and "`touch" in listed  # the planted names do reach the completion
    for shell in ("bash", "zsh"):
        for prefix in ("", "$", "`", "2026"):
            done = _completion(shell, ["clusterfsdp", "status", prefix], env, tmp_path)
            assert done.returncode == 0, done.stderr
            offered = [w for w in done.stdout.split() if w]
            assert not any(p.exists() for p in proofs), (shell, prefix)
            assert offered == ([mine.id] if prefix in ("", "2026") else []), (shell, prefix, offered)
