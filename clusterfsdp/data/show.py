"""`clusterfsdp data show JOB`: the samples a job trains (or evaluates) on, decoded, with the
tokens the loss is computed on marked.

The only evidence of an answers-only loss used to be a percentage ("19.8% of label positions
trained on"); checking it took decoding the `.tok`/`.msk` shards by hand. This reads the
prepared data exactly as the ranks do (samples.PreparedSamples, mixsamples.MixtureSamples: the
same index, the same seeded order, the same mask) and never prepares anything: data that is not
prepared is one line saying how to prepare it.

A trained token is one that is a label of the loss: every token of a sample but the first of
each document (nothing predicts it), minus those the chat mask leaves out (prompts, system
messages) and padding. They are shown green on a terminal and between `[[` and `]]` elsewhere
(`NO_COLOR`, pipes, files). `--json` gives the same as data (the TUI's data screen reads it).
Runs in its own process (`python -m clusterfsdp.data.show`), like `data prepare`: the CLI and
the TUI never import numpy or the tokenizer.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core import spec as specmod
from ..core.term import use_colour
from .cache import DatasetRef, dataset_refs, same_data_problem
from .checks import source_problems
from .mixsamples import MixtureSamples, open_mixture
from .mixture import label
from .samples import PreparedSamples
from .samplesets import index_id, index_meta, sample_roles
from .sources import DataError
from .tokens import BOS, EOS, PAD, ByteTokenizer, load_tokenizer
from .unpaired import UNDESIRABLE

OPEN, CLOSE = "[[", "]]"  # around trained tokens in plain text
_BYTE_SPECIALS = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


@dataclass
class Shown:
    """One sample as text: its documents, each a list of (text, trained) pieces."""

    title: str
    documents: list[list[tuple[str, bool]]] = field(default_factory=list)
    padding: int = 0  # positions of the sample after its last document
    names: tuple[str, ...] = ()  # what each document is (a preference pair's 'chosen', 'rejected')
    tokens: int = 0
    trained: int = 0


class ShowError(DataError):
    """What keeps the data from being shown (one line, exit 2)."""


def _decode(tok: Any, ids: list[int]) -> str:
    """Token ids as text, special tokens included (they are part of what is trained on)."""
    if isinstance(tok, ByteTokenizer):
        out, raw = [], bytearray()
        for i in ids:
            if i < 256:
                raw.append(i)
                continue
            out.append(raw.decode("utf-8", errors="replace") + _BYTE_SPECIALS.get(i, f"<{i}>"))
            raw = bytearray()
        return "".join(out) + raw.decode("utf-8", errors="replace")
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def pieces_of(tok: Any, ids: list[int], trained: list[bool]) -> list[tuple[str, bool]]:
    """The runs of trained and untrained tokens as text. Each run is the text its tokens add to
    the decoding of everything before them (a run decoded alone may lose a leading space or
    split a character), or decoded alone where the decoder is not prefix-stable."""
    cuts = [0] + [i for i in range(1, len(ids)) if trained[i] != trained[i - 1]] + [len(ids)]
    out, before = [], ""
    for a, b in itertools.pairwise(cuts):
        upto = _decode(tok, ids[:b])
        text = upto[len(before) :] if upto.startswith(before) else _decode(tok, ids[a:b])
        out.append((text, trained[a]))
        before = upto
    return out


def render_sample(tok: Any, samples: PreparedSamples, k: int, title: str) -> Shown:
    """Sample k of a prepared index, decoded. With documents packing each range is a document (or
    a piece of one) and the rest of seq_len is padding; with concat packing the ranges together
    are one window of seq_len + 1 tokens over documents joined by EOS."""
    ranges = samples.pieces(k)
    docs = []
    for start, n in ranges:
        ids = samples.tokens.read(start, n)
        mask = samples.mask.read(start, n) != 0 if samples.mask is not None else np.ones(n, bool)
        docs.append((ids, mask))
    pairs = getattr(samples, "pairs", False)
    if not samples.documents and not pairs:  # one window: its ranges are consecutive parts of it
        docs = [(np.concatenate([ids for ids, _ in docs]), np.concatenate([mask for _, mask in docs]))]
    names: tuple[str, ...] = ("chosen", "rejected") if pairs else ()
    if getattr(samples, "unpaired", False):  # data/unpaired.py: the label is in the completion's mask
        undesirable = samples.mask is not None and samples.mask.read(ranges[0][0], ranges[0][1]).max() == UNDESIRABLE
        names = ("undesirable completion" if undesirable else "desirable completion", "KL row (another's completion)")
    shown = Shown(title, names=names)
    for ids, mask in docs:
        trained = [False, *(bool(m) for m in mask[1:])]  # the first token is no label
        shown.documents.append(pieces_of(tok, [int(i) for i in ids], trained))
        shown.tokens += len(ids)
        shown.trained += sum(trained)
    used = sum(n - 1 for _, n in ranges) if samples.documents or pairs else samples.seq_len
    shown.padding = samples.seq_len * (2 if pairs else 1) - used
    return shown


# ---------------------------------------------------------------- what the job reads
def _prepared(spec: specmod.JobSpec, job: str) -> list[DatasetRef]:
    """The job's prepared datasets; ShowError when one is not prepared (or not indexed), saying
    how to prepare it (`job`: the job file and its --set options, as given)."""
    refs = dataset_refs(spec)
    if problem := same_data_problem(refs):
        raise ShowError(problem)
    how = f"prepare it with `clusterfsdp data prepare {job}` (or submit the job, which prepares it)"
    for ref in refs:
        what = label(spec, ref.part) if ref.part >= 0 else f"the {ref.role} data"
        if ref.manifest() is None:
            raise ShowError(f"{what} is not prepared yet ({ref.folder}): {how}")
        for role, data_role in sample_roles(spec):
            if data_role == ref.role and index_meta(ref, spec, role) is None:
                raise ShowError(f"{what} has no {role} samples of seq_len {spec.data.seq_len} yet: {how}")
    return refs


def open_split(spec: specmod.JobSpec, refs: list[DatasetRef], split: str) -> PreparedSamples | MixtureSamples:
    """The training or eval samples as the ranks open them (rankdata.open_for_training)."""
    folders = {ref.role: ref.folder for ref in refs if ref.part < 0}
    data_role = dict(sample_roles(spec))[split]
    if spec.data.sources and data_role == "train":
        return open_mixture(spec, [r.folder for r in refs if r.part >= 0], split)[0]
    return PreparedSamples(folders[data_role], index_id(spec, split), spec.data.seq_len, spec.job.seed, split)


def show(spec: specmod.JobSpec, job: str, split: str = "train", source: int | None = None, n: int = 4) -> list[Shown]:
    """The first `n` samples of the split in the order the job reads them (of one source of a
    mixture with `source`: that source's own order), decoded. `job`: how the job was named (for
    the `data prepare` command an unprepared dataset's refusal gives)."""
    if spec.data.source != "files":
        raise ShowError("data.source = 'synthetic': the job trains on random tokens, there is no data to show")
    if split == "eval" and not spec.eval_enabled:
        raise ShowError("--split eval: the job has no eval set (set eval.fraction or eval.paths)")
    mixed = bool(spec.data.sources) and not (split == "eval" and spec.eval.paths)
    if source is not None and not mixed:
        why = "eval.paths is one dataset" if spec.data.sources else "the job reads one dataset (data.paths)"
        raise ShowError(f"--source {source}: {why}; --source picks one of [[data.sources]]")
    if source is not None and not 0 <= source < len(spec.data.sources):
        raise ShowError(f"--source {source}: the job has data.sources[0] to [{len(spec.data.sources) - 1}]")
    if errors := source_problems(spec):
        raise ShowError(errors[0])
    samples = open_split(spec, _prepared(spec, job), split)
    tok = load_tokenizer(spec.data.tokenizer)
    out = []
    for position in range(n):
        if isinstance(samples, MixtureSamples):
            i, j = (source, position) if source is not None else samples.schedule(position)
            part = samples.parts[i]
            k = part.index_of(j)
            title = (
                f"{split} position {position}: {label(spec, i)}, its sample {k:,} of {part.count:,}"
                if source is None
                else f"{split} {label(spec, i)} sample {k:,} of {part.count:,} (position {j} of its order)"
            )
        else:
            part, k = samples, samples.index_of(position)
            title = f"{split} sample {k:,} of {samples.count:,} (position {position} of the order)"
        out.append(render_sample(tok, part, k, title))
    return out


# ---------------------------------------------------------------- output
def _paint(text: str, trained: bool, colour: bool) -> str:
    if not trained or not text:
        return text
    return f"\x1b[1;32m{text}\x1b[0m" if colour else f"{OPEN}{text}{CLOSE}"


def render_text(shown: list[Shown], colour: bool) -> str:
    """The samples for a terminal (`colour`) or for plain text: a header line per sample, its
    documents (a rule between them), the padding counted rather than printed."""
    how = "in green" if colour else f"between {OPEN} and {CLOSE}"
    lines = [f"trained tokens (the loss's labels) are {how}"]
    for s in shown:
        head = f"== {s.title}: {s.tokens:,} tokens, {s.trained:,} trained"
        head += f", {s.padding:,} padding positions" if s.padding else ""
        lines.append(f"\x1b[2m{head}\x1b[0m" if colour else head)
        for d, document in enumerate(s.documents):
            if s.names:
                lines.append(f"-- {s.names[d]} --")
            elif d:
                lines.append(f"-- document {d + 1} --")
            lines.append("".join(_paint(text, trained, colour) for text, trained in document))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clusterfsdp data show")
    p.add_argument("job")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--source", type=int, default=None, help="a mixture's data.sources[I] only, in its own order")
    p.add_argument("-n", type=int, default=4, help="how many samples (default 4)")
    p.add_argument("--split", choices=["train", "eval"], default="train")
    p.add_argument("--json", action="store_true", help="the samples as JSON")
    args = p.parse_args(argv)
    try:
        spec = specmod.load(args.job, args.set)
        command = shlex.join([args.job, *(x for item in args.set for x in ("--set", item))])  # what to prepare
        shown = show(spec, command, args.split, args.source, max(args.n, 0))
    except specmod.SpecError as e:
        for line in e.errors:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"schema": 1, "samples": [asdict(s) for s in shown]}))
        return 0

    print(render_text(shown, use_colour(sys.stdout)))
    return 0


if __name__ == "__main__":
    # It reads prepared data and the tokenizer prepare used, never the hub; and a `data show` that
    # a warm launcher forks (core/warmlaunch.py) has its modules imported under this default too.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
