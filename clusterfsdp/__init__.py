"""clusterfsdp: from a job.toml to a multi-node FSDP2/HSDP training run on Slurm (or this machine).

The library API is the run service, `clusterfsdp.Run` (submit, resume, cancel, status, export),
which the CLI, the TUI and the notebook all call. Importing the package is cheap (no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import submit, sweep
    from .control.run import Run
    from .core.errors import UserError
    from .frames import metrics_frame
    from .notebook.magics import load_ipython_extension

__version__ = "0.1.0"
__all__ = ["Run", "UserError", "load_ipython_extension", "metrics_frame", "submit", "sweep"]

# Each public name and the module that defines it, imported when the name is first asked for
# (PEP 562): every `clusterfsdp.*` import runs this package first, the CLI's `--help` included,
# so it imports none of them (the run service, the notebook API, pandas for `metrics_frame`).
_DEFINED_IN = {
    "Run": "control.run",
    "UserError": "core.errors",  # the base of every error the user can act on
    "metrics_frame": "frames",
    "submit": "api",
    "sweep": "api",
    "load_ipython_extension": "notebook.magics",  # `%load_ext clusterfsdp`
}


def __getattr__(name: str) -> Any:
    if name not in _DEFINED_IN:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}"), name)
