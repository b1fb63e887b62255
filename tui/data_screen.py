"""Data: the samples a job trains on, decoded, the trained tokens (the loss's labels) marked, as
`clusterfsdp data show` prints them. Opened with d from the Run screen (the run's job) and from
Compose (the job file as saved). The samples are read by `python -m clusterfsdp.data.show
--json` in a worker: the TUI never imports numpy or a tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from clusterfsdp.core import warmlaunch

from .latest import deliver
from .shown_paths import shown

TRAINED = "bold $success on $success-muted"  # the same tokens `data show` prints green or in [[ ]]
STEP = 4  # samples more (n) or fewer (N) at a time


def sample_content(sample: dict[str, Any]) -> Content:
    """One sample of `data show --json`: its title, then its documents, trained pieces styled."""
    head = f"{sample['title']}: {sample['tokens']:,} tokens, {sample['trained']:,} trained"
    head += f", {sample['padding']:,} padding positions" if sample["padding"] else ""
    parts: list[Content | str | tuple[str, str]] = [Content.styled(head, "bold"), "\n"]
    for d, document in enumerate(sample["documents"]):
        if d:
            parts += [Content.styled(f"-- document {d + 1} --", "dim"), "\n"]
        parts += [(text, TRAINED) if trained else text for text, trained in document]
        parts.append("\n")
    return Content.assemble(*parts)


def start_reader(argv: list[str], out: IO[str], err: IO[str]) -> subprocess.Popen[str] | warmlaunch.Served:
    """`data show` writing to `out` and `err`, reading nothing: forked by a warm launcher of this
    user when one is named (core/warmlaunch.py; the tokenizer's libraries imported once), else
    a new interpreter (about 2 s of imports per read)."""
    with open(os.devnull, "rb") as nothing:
        served, _ = warmlaunch.popen(argv, os.environ, (nothing.fileno(), out.fileno(), err.fileno()))
    if served is not None:
        return served
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True)


class DataScreen(Screen):
    """The first samples of one split (and one source of a mixture) of a job's prepared data."""

    HELP = (
        "The first samples the job reads, in its order, decoded with its tokenizer: the tokens the "
        "loss is computed on (answers of chat data, every token but a document's first for text) "
        "are highlighted. t switches between the training and the eval samples, s steps through "
        "the sources of a mixture (each in its own order; then all of them again), n shows more "
        "samples and N fewer. Data that is not prepared says how to prepare it "
        "(`clusterfsdp data prepare JOB`). The same as `clusterfsdp data show JOB`."
    )
    BINDINGS = [
        Binding("t", "split", "Train/eval"),
        Binding("s", "source", "Source"),
        Binding("n", "more", "More"),
        Binding("N", "fewer", "Fewer"),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, job: Path, sources: int = 0) -> None:
        super().__init__()
        self.job, self.sources = job, sources  # sources: how many [[data.sources]] the job has
        self.split, self.source, self.count = "train", None, STEP
        self.samples: list[dict[str, Any]] = []
        self.error = ""

    def compose(self) -> ComposeResult:
        yield Static(id="data-header")
        with VerticalScroll(id="data-samples"):
            yield Static(id="data-body")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self._load()

    def _show_header(self, state: str) -> None:
        which = "all sources" if self.source is None else f"data.sources[{self.source}]"
        which = which if self.sources else "one dataset"
        self.query_one("#data-header", Static).update(
            Content.from_markup(
                "[b]data[/] $job  ($split samples, $which, $count shown)  $state",
                job=shown(self.job),
                split=self.split,
                which=which,
                count=str(self.count),
                state=state,
            )
        )

    def _load(self) -> None:
        self._show_header("reading…")
        self._read(self.job, self.split, self.source, self.count)

    @work(thread=True, exclusive=True, group="data-show", exit_on_error=False)
    def _read(self, job: Path, split: str, source: int | None, count: int) -> None:
        """Read in a process of its own (`start_reader`). A read overtaken by a newer key press
        (`exclusive` cancels its worker) kills its reader and shows nothing: reads of t, s, n
        pressed in a row would run side by side, ending in any order (`latest`)."""
        argv = [sys.executable, "-m", "clusterfsdp.data.show", str(job), "--json", "-n", str(count), "--split", split]
        argv += ["--source", str(source)] if source is not None else []
        worker = get_current_worker()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            reader = start_reader(argv, out, err)
            while True:
                try:
                    code = reader.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    if worker.is_cancelled:
                        reader.kill()
                        reader.wait()
                        return
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if code == 0:
            samples, error = json.loads(stdout)["samples"], ""
        else:
            lines = stderr.strip().splitlines() or [f"data show ended with exit status {code}"]
            samples, error = [], lines[-1].removeprefix("error: ")
        deliver(self.app, self._shown, samples, error)

    def _shown(self, samples: list[dict[str, Any]], error: str) -> None:
        self.samples, self.error = samples, error
        body = self.query_one("#data-body", Static)
        if error:
            body.update(Content.styled(error, "$error"))
        else:
            body.update(Content("\n").join(sample_content(s) for s in samples))
        self._show_header("" if not error else "(not shown)")

    def action_split(self) -> None:
        self.split = "eval" if self.split == "train" else "train"
        self._load()

    def action_source(self) -> None:
        if not self.sources:
            self.app.notify("the job reads one dataset (data.paths): no sources to step through")
            return
        self.source = 0 if self.source is None else None if self.source + 1 >= self.sources else self.source + 1
        self._load()

    def action_more(self) -> None:
        self.count += STEP
        self._load()

    def action_fewer(self) -> None:
        self.count = max(1, self.count - STEP)
        self._load()
