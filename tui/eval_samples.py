"""The run screen's eval samples: what the model generated at its newest evaluation
(`[eval] samples`, `<run>/samples/step-N.jsonl`), one row a prompt. Hidden while the run has
none, so runs without samples keep the room for their charts. It follows its folder itself
(a listing every 2 s while its screen shows, the newest file read in a worker only when a newer
step appears)."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.widgets import DataTable

from clusterfsdp.core import evalsamples

from .latest import deliver

SHOWN_CHARS = 200  # of a prompt (its end: the part the completion follows) and of a completion
PROMPT_SHARE = 0.4  # of the table's width at most: the completion keeps the rest, on screen


def _one_line(text: str) -> str:
    return text.replace("\n", "⏎ ")


def _tail(text: str, width: int) -> str:
    """The end of a prompt in `width` characters (what the completion follows)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def _head(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def column_widths(total: int, prompts: list[str]) -> tuple[int, int]:
    """Widths of the prompt and completion columns in a table `total` cells wide: the prompt
    column as wide as the longest prompt but at most PROMPT_SHARE of the table, the completion
    column the rest, so a long prompt never pushes the completion off screen (each column has
    a cell of padding on both sides)."""
    room = max(total - 4, 20)
    prompt = min(max((len(p) for p in prompts), default=0), max(int(room * PROMPT_SHARE), 8))
    return max(prompt, 6), max(room - max(prompt, 6), 8)


class EvalSamples(DataTable):
    DEFAULT_CSS = """
    EvalSamples {
        height: 8;
        border: round $panel-lighten-2;
        display: none;
    }
    EvalSamples.-shown {
        display: block;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.folder: Path | None = None
        self.step: int | None = None  # the step shown
        self.samples: list[tuple[str, str]] = []  # (prompt, completion) shown, each on one line

    def on_mount(self) -> None:
        self.border_title = "eval samples"
        self.set_interval(2.0, self.refresh_samples)

    def follow(self, folder: Path | None) -> None:
        """Show the samples of another run (its samples folder; None: no run)."""
        if folder != self.folder:
            self.folder, self.step, self.samples = folder, None, []
            self.clear()
            self.remove_class("-shown")
        self.refresh_samples()

    def refresh_samples(self) -> None:
        if self.folder is not None and self.screen.is_current:  # not while another screen shows
            self._read(self.folder, self.step)

    @work(thread=True, exclusive=True, group="eval-samples", exit_on_error=False)
    def _read(self, folder: Path, shown: int | None) -> None:
        steps = evalsamples.steps(folder)
        if not steps or steps[-1] == shown:
            return
        samples = evalsamples.read(folder, steps[-1])
        deliver(self.app, self._show, folder, steps[-1], samples)

    def _show(self, folder: Path, step: int, samples: list[evalsamples.EvalSample]) -> None:
        if folder != self.folder:
            return
        self.step = step
        self.samples = [(_one_line(s.prompt)[-SHOWN_CHARS:], _one_line(s.completion)[:SHOWN_CHARS]) for s in samples]
        self._fill()
        self.border_title = f"eval samples at step {step} (greedy)"
        self.set_class(bool(samples), "-shown")

    def on_resize(self) -> None:
        if self.samples:
            self._fill()

    def _fill(self) -> None:
        """The rows cut to the columns' widths for the table's width now."""
        prompt, completion = column_widths(self.size.width, [p for p, _ in self.samples])
        self.clear(columns=True)
        self.add_column("PROMPT", key="prompt", width=prompt)
        self.add_column("COMPLETION", key="completion", width=completion)
        for p, c in self.samples:
            self.add_row(_tail(p, prompt), _head(c, completion))
