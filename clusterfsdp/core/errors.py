"""The one base class of every error the user can act on (a bad job file, a refused submission,
a run that is busy, Slurm not answering, a notebook launch that cannot start): each front-end
catches `UserError` and shows its message without a traceback, the same way everywhere:

- the CLI prints each of its `lines` after `error:` and exits 2;
- the TUI shows them in a notification;
- IPython (the notebook, `clusterfsdp.Run` in a cell) calls `_render_traceback_`.

Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix, said in one line per problem (exit 2)."""

    @property
    def lines(self) -> list[str]:
        return str(self).splitlines() or [type(self).__name__]

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {line}" if i == 0 else line for i, line in enumerate(self.lines)]

    def one_line(self) -> str:
        """The message on one line (a notification, a log row)."""
        return "; ".join(self.lines)


def describe(error: BaseException) -> str:
    """One line for a front-end that shows errors in place (the TUI's notifications): a
    UserError's message alone, anything else (a bug) with its type so it can be reported."""
    if isinstance(error, UserError):
        return error.one_line()
    return f"{type(error).__name__}: {error}"
