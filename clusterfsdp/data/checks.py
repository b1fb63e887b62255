"""What `validate` and `submit` check about a job's data before anything is queued, cheaply:
every path names sources, the first record of each is readable, the tokenizer fits the
format, and data that is already prepared is big enough. Pure Python (the control plane
imports it). Each function returns error lines; none raises for bad data."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from ..core import spec as specmod
from . import kinds, mixture, skipped
from .cache import DatasetRef, dataset_inputs, dataset_refs, same_data_problem
from .formats import has_chat_template
from .overlap import shared_documents
from .samplesets import (
    batch_problem,
    epochs_note,
    eval_batches_note,
    eval_samples,
    held_out_pieces,
    holdout_note,
    index_meta,
    least_windows_problem,
    sample_roles,
    stats_line,
    total_steps,
)
from .sources import DataError, Source, matches

SNIFF_FILES = 200  # files whose first record the checks read (all are checked for existence)
VALIDATE_HASH_BYTES = 256 << 20  # `validate` hashes sources up to this size to find their prepared form


def sniff(source: Source, data: specmod.DataSection) -> list[str]:
    """Problems in the first record of a source (the whole of it is read by prepare)."""
    if source.is_folder and not source.files():
        return [f"{source.field}: {source.path}: empty folder"]
    return kinds.of(source).sniff(source, data)


def tokenizer_problems(data: specmod.DataSection) -> list[str]:
    if data.tokenizer == "bytes":
        chat = [i for i, s in enumerate(data.sources) if s.format == "chat"]
        if chat and data.format != "chat":  # data.format = 'chat': the spec's own checks say it
            return [f"data.sources[{chat[0]}].format: 'chat' needs a tokenizer with a chat template; 'bytes' has none"]
        return []
    folder = Path(data.tokenizer)
    if not folder.is_dir():
        if specmod.looks_like_hub_id(data.tokenizer):
            return [f"data.tokenizer: {data.tokenizer!r} is a hub id; hub ids are resolved at submit"]
        return [f"data.tokenizer: {data.tokenizer!r} is neither 'bytes' nor a local tokenizer folder"]
    if (data.format == "chat" or any(s.format == "chat" for s in data.sources)) and not has_chat_template(folder):
        return [
            f"data.tokenizer: {folder} has no chat template (tokenizer_config.json 'chat_template' or "
            "chat_template.jinja), which data.format = 'chat' needs"
        ]
    return []


def source_problems(spec: specmod.JobSpec) -> list[str]:
    """Field-level error lines about the job's sources, cheap enough for every validate and
    submit: every path names files, none is empty, the first record of every text source (up
    to SNIFF_FILES) is UTF-8 JSON with the key, the tokenizer has a chat template for
    format = 'chat'. Prepare reads everything and reports the rest the same way."""
    if spec.data.source != "files":
        return []
    errors: list[str] = []
    sources: list[tuple[Source, specmod.DataSection]] = []
    for given in dataset_inputs(spec):
        found, problems = kinds.local_sources(given.field, given.paths)
        sources += [(s, given.data) for s in found]
        errors += problems
    for s, data in sources[:SNIFF_FILES]:
        errors += sniff(s, data)
    return errors + tokenizer_problems(spec.data)


def container_only_paths(spec: specmod.JobSpec) -> list[str]:
    """Data paths of a container job that do not exist on this host: they may exist only in the
    image, so they are checked when the job starts (prepare runs inside the container)."""
    if spec.slurm.container.kind == "none" or spec.data.source != "files":
        return []
    return [p for p in [*spec.data.paths, *spec.eval.paths] if not matches(p)]


def problems(spec: specmod.JobSpec) -> list[str]:
    """The error lines `validate` and `submit` refuse a job for (empty: nothing found):
    `source_problems`, and data that is already prepared but smaller than one global batch
    (container jobs: the paths that exist on this host; see `container_only_paths`)."""
    inside = set(container_only_paths(spec))
    if inside:
        keep = [p for p in spec.data.paths if p not in inside]
        if not keep:  # nothing to check here: the worker checks it all
            return []
        spec = dataclasses.replace(
            spec,
            data=dataclasses.replace(spec.data, paths=keep),
            eval=dataclasses.replace(spec.eval, paths=[p for p in spec.eval.paths if p not in inside]),
        )
    errors = source_problems(spec)
    prompts = spec.eval.samples_file
    if prompts and not Path(prompts).is_file():  # read by every rank at the start
        errors.append(f"eval.samples_file: {prompts} is not a file")
    if errors:
        return errors
    return [line.removeprefix("error: ") for line in prepared_state(spec) if line.startswith("error: ")]


def prepared_state(spec: specmod.JobSpec) -> list[str]:
    """Lines for `validate`: whether each dataset is prepared (looking it up costs hashing the
    sources once, up to VALIDATE_HASH_BYTES; bigger sources are looked up by the job itself),
    and 'error: ...' lines for prepared data smaller than one batch."""
    if spec.data.source != "files":
        return []
    try:
        refs = dataset_refs(spec, budget=VALIDATE_HASH_BYTES)
    except (DataError, OSError) as e:
        return [f"error: {e}"]
    if problem := same_data_problem(refs):
        return [f"error: {problem}"]
    out = [f"error: {problem}" for problem in build_missing_indexes(spec, refs)]
    try:
        for ref in refs:
            out += _dataset_state(spec, ref)
        out += mixture.state_lines(spec, refs)
        shared = shared_documents(refs[0], refs[1]) if len(refs) == 2 else None
    except DataError as e:  # a cache entry not to trust
        return [*out, f"error: {e}"]
    if shared is not None and (warning := shared.warning()):
        out.append(f"warning: {warning}")
    return out


def build_missing_indexes(spec: specmod.JobSpec, refs: list[DatasetRef]) -> list[str]:
    """Build the sample indexes the job will read of datasets that are prepared already (what
    the job would build at its start), so that validate and submit know every sample set's
    size before anything is queued: one `python -m clusterfsdp.data.index` (numpy; the control
    plane never imports it) for all of them. Returns the error lines of those that cannot be
    built as the job asks (eval.fraction too small for one evaluation batch, ...)."""
    missing = []
    for ref in refs:
        try:
            if ref.key is None or ref.manifest() is None:
                continue
        except DataError:
            continue  # an entry that may not be trusted: prepared_state names it

        missing += [
            f"{role}:{ref.part}:{ref.folder}"
            for role, data_role in sample_roles(spec)
            if data_role == ref.role and index_meta(ref, spec, role) is None
        ]
    if not missing:
        return []
    text = specmod.dumps(dataclasses.replace(spec, env={}))  # no secrets through the pipe
    done = subprocess.run(
        [sys.executable, "-m", "clusterfsdp.data.index", *missing], input=text, capture_output=True, text=True
    )
    if done.returncode not in (0, 2):  # a bug: the job would meet it too, and say it there
        return []
    return [line.removeprefix("error: ") for line in done.stdout.splitlines() if line.startswith("error: ")]


def _dataset_state(spec: specmod.JobSpec, ref: DatasetRef) -> list[str]:
    """validate's lines about one prepared dataset (or one that is not prepared yet)."""
    if ref.key is None:
        return [f"{ref.role}: not looked up (sources over {VALIDATE_HASH_BYTES >> 20} MB not fingerprinted yet)"]
    manifest = ref.manifest()
    if manifest is None:
        out = [
            f"{ref.role}: not prepared yet: the job prepares it at start (or `clusterfsdp data prepare`) "
            f"into {ref.folder}"
        ]
        if ref.role == "train" and ref.part <= 0 and spec.train.epochs > 0:
            out.append(f"train: train.epochs = {spec.train.epochs:g}: the steps are counted once the data is prepared")
        bound = _byte_tokens(ref.sources, spec) if ref.role == "train" and ref.part < 0 else None
        if bound is not None:
            out += _capacity_lines(spec, *bound, documents=len(ref.sources) if bound[1] else None)
        return out
    out = [f"{ref.role}: prepared, {manifest['tokens']:,} tokens in {manifest['documents']:,} documents ({ref.folder})"]
    out += skipped.lines(ref.role, manifest)
    if problem := skipped.reuse_problem(spec.data.bad_records, ref.role, manifest):
        out.append(f"error: {problem}")
    if ref.part >= 0:  # a source of a mixture: its index statistics; the rest is the mixture's (mixture.py)
        meta = index_meta(ref, spec, "train")
        return [*out, f"{stats_line('train', meta)} ({mixture.label(spec, ref.part)})"] if meta else out
    if ref.role == "train":
        out += _capacity_lines(spec, int(manifest["tokens"]), True, documents=int(manifest["documents"]))
    for role, data_role in sample_roles(spec):
        meta = index_meta(ref, spec, role) if data_role == ref.role else None
        if meta is None:
            continue
        out.append(stats_line(role, meta))
        if problem := batch_problem(spec, role, int(meta["samples"]), meta):
            out.append(f"error: {problem}")
        elif role == "train":
            samples = int(meta["samples"])
            if note := epochs_note(spec, samples, total_steps(spec, samples)):
                out.append(f"train: {note}")
        elif role == "eval":
            notes = [holdout_note(spec, meta), eval_batches_note(spec, int(meta["samples"]))]
            out += [f"eval: {note}" for note in notes if note]
    return out


def _byte_tokens(sources: tuple[Source, ...], spec: specmod.JobSpec) -> tuple[int, bool] | None:
    """An upper bound of the tokens of sources not prepared yet, and whether it is exact, where
    the file sizes tell: the byte tokenizer on uncompressed .txt (exact: its bytes and an EOS)
    and .jsonl files (fewer: JSON syntax is not text)."""
    if spec.data.tokenizer != "bytes" or not all(kinds.of(s).plain_text(s) for s in sources):
        return None
    txt = sum(kinds.of(s).one_document for s in sources)
    return sum(s.size() for s in sources) + txt, txt == len(sources)


def _capacity_lines(spec: specmod.JobSpec, tokens: int, exact: bool, documents: int | None) -> list[str]:
    """An error line when the training data cannot hold the batches the job needs; with a
    held-out fraction of one document (known exactly), what the held-out split will be."""
    problem = least_windows_problem(spec, tokens, exact)
    if problem:
        return [f"error: {problem}"]
    if not (exact and documents == 1 and spec.eval.fraction and not spec.eval.paths):
        return []  # more documents: the index decides (documents or windows) when it is built
    size = spec.data.seq_len + 1
    held = held_out_pieces(spec, -(-tokens // size), tokens // size)
    samples = eval_samples(spec, held)
    meta = {"holdout": "windows", "documents": held, "of_documents": documents}
    notes = [holdout_note(spec, meta), eval_batches_note(spec, samples)]
    return [f"eval: {note}" for note in notes if note]
