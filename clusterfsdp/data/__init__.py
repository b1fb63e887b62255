"""Training data, by concern: from the paths a job names to the batches a rank reads.

The torch-free half (the control plane imports it for `validate`, `submit` and `status`; listed
in TORCH_FREE, which tests/test_layout.py checks and docs/ARCHITECTURE.md shows): `sources`
(what a source is; the walk of a path's glob), `kinds` (the kinds of source, one module each:
`txtfile`, `jsonlfile`, `parquetfile`, `hfdatasets`, on `filekind`'s interface and `linefiles`;
which sources the paths name), `units` (planning a prepare), `formats` (what a record is),
`fieldmap` and `unpaired` (a record's fields), `trust` (whom a shared cache trusts, sealed files),
`cache` (the prepared-data cache: keys, fingerprints, layout), `samplesets` (which sample sets
a job reads and their size checks), `checks` (what is refused before queueing), `samplestats`
(a run's data statistics, which `status` shows).
The numpy half, on workers and in `clusterfsdp data prepare`:
`readers` (a unit's records -> tokens), `tokens` (documents -> token ids), `shards` (shard
files), `pool` (the tokenizing processes), `prepare` (building a dataset under its lock;
`python -m clusterfsdp.data.prepare`), `index` (samples of one seq_len / packing / split), and
`samples` (torch: batches read with pread), `mixsamples` (a mixture's), `rankdata` (a job's
data opened on a rank, rank 0 preparing). The numpy half imports the torch-free half, never
the reverse. Importing this package imports nothing.
"""

TORCH_FREE = (
    "sources", "formats", "fieldmap", "unpaired", "trust", "cache", "samplesets", "mixture", "overlap", "checks",
    "skipped", "arraystate", "samplestats", "recordparts", "filekind", "linefiles", "txtfile", "jsonlfile",
    "parquetfile", "hfdatasets", "kinds", "units",
)  # fmt: skip
"""The modules of this package that import neither numpy nor torch (nor this package's others)."""
