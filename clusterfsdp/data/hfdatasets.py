"""Dataset folders: one written by `datasets`' `save_to_disk` (`SavedDataset`: a dataset_dict.json
or state.json in it), or any other folder `datasets.load_dataset` reads (`DatasetFolder`, the
kind of every folder no other kind claims). A unit is a range of rows. `datasets` is imported
only when a job names such a folder (it is heavy). Pure Python otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core import fileio
from ..core import spec as specmod
from . import trust
from .filekind import ROWS_PER_READ, FileKind, Planning, Record, SourceUnit, UnitReading
from .formats import column_problem
from .sources import DataError, Source


class DatasetFolder(FileKind):
    name = "dataset_folder"
    folder = True

    def recognises(self, path: Path, name: str, is_dir: bool) -> bool:
        return is_dir

    def load(self, src: Source, data: specmod.DataSection, cache: Path) -> Any:
        """The folder's rows, as one split (DataError naming the folder for anything datasets
        cannot read, and for a column the record mapping reads and the rows lack)."""
        # HuggingFace datasets (heavy) only for a dataset folder
        import datasets

        where = f"{src.field}: {src.path}"
        try:
            ds = self._open(datasets, src, data, cache)
        except DataError:
            raise
        except Exception as e:  # datasets raises many kinds for unreadable folders and unknown splits
            raise DataError(f"{where}: datasets cannot read it: {type(e).__name__}: {e}") from None
        problem = column_problem(where, data, ds.column_names)
        if problem:
            raise DataError(problem)
        return ds

    def _open(self, datasets: Any, src: Source, data: specmod.DataSection, cache: Path) -> Any:
        """A folder `datasets.load_dataset` reads: it copies the rows into its cache and reuses
        them, so into a folder of this user's only."""
        own = trust.private_folder(cache / "hf-datasets")
        return datasets.load_dataset(src.path, split=data.split, cache_dir=str(own))

    def units(self, src: Source, index: int, shard: int, plan: Planning) -> Iterator[SourceUnit]:
        ds = self.load(src, plan.data, plan.cache)
        rows = len(ds)
        per_unit = max(1, plan.unit_bytes * rows // max(1, ds.data.nbytes))
        size = src.size()
        for start in range(0, rows, per_unit):
            stop = min(rows, start + per_unit)
            yield SourceUnit(shard, index, start, stop, size * (stop - start) // max(1, rows), start + 1)
            shard += 1

    def records(self, reader: UnitReading, src: Source, unit: SourceUnit) -> Iterator[Record]:
        if unit.source not in reader.opened:
            reader.opened[unit.source] = self.load(src, reader.data, reader.cache)
        ds = reader.opened[unit.source]
        columns = reader.fields.columns()
        for at in range(unit.start, unit.stop, ROWS_PER_READ):
            batch = ds[at : min(unit.stop, at + ROWS_PER_READ)]
            rows = [
                dict(zip(columns, values, strict=True)) for values in zip(*(batch[c] for c in columns), strict=True)
            ]
            yield from reader.rows(src, rows, at + 1)


class SavedDataset(DatasetFolder):
    name = "saved_dataset"

    def _open(self, datasets: Any, src: Source, data: specmod.DataSection, cache: Path) -> Any:
        """A save_to_disk folder: the dataset, or the split of a DatasetDict."""
        ds = datasets.load_from_disk(src.path)
        if isinstance(ds, datasets.DatasetDict):
            if data.split not in ds:
                it_has = ", ".join(map(str, ds))
                raise DataError(f"{src.field}: {src.path}: no split {data.split!r} ({src.split_key}; it has: {it_has})")
            ds = ds[data.split]
        return ds

    def recognises(self, path: Path, name: str, is_dir: bool) -> bool:
        return is_dir and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())

    def sniff(self, source: Source, data: specmod.DataSection) -> list[str]:
        """The split exists and its features have the record key."""
        root = Path(source.path)
        where = f"{source.field}: {source.path}"
        if (root / "dataset_dict.json").is_file():
            try:
                splits = fileio.load_json(root / "dataset_dict.json").get("splits", [])
            except (OSError, ValueError, AttributeError) as e:
                return [f"{where}: dataset_dict.json: cannot read: {e.strerror if isinstance(e, OSError) else e}"]
            if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
                return [f"{where}: dataset_dict.json: 'splits' is not a list of names"]
            if data.split not in splits:
                return [f"{where}: no split {data.split!r} ({source.split_key}; it has: {', '.join(splits)})"]
            root = root / data.split
        try:
            features = fileio.load_json(root / "dataset_info.json").get("features") or {}
        except (OSError, ValueError, AttributeError):
            return []
        if not isinstance(features, dict):
            return []
        problem = column_problem(where, data, list(features)) if features else None
        return [problem] if problem else []


SAVED, FOLDER = SavedDataset(), DatasetFolder()
