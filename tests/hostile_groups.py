"""The 26 groups of hostile inputs and moments the hostile matrix covers (tests/test_hostile_outdir.py, _hdf5.py,
_arrays.py, _config.py, _records.py, _workers.py, _runs.py, _metadata.py, _zarr.py, _matlab.py). Each test's
docstring starts with "Hostile group N:" and says what the code did before the case was handled;
docs/reliability.md counts the test cases per group.

Groups 1-8 lose data, 9-12 and 25 read outside the named inputs or invent/drop values, 13-15 take unbounded memory
or time from a tiny input, 16 ends in a traceback instead of one error line, 26 in a crash, 17-18 fail a run at a
bad moment (it must end in one line and leave nothing behind), 19-20 are inputs at the limits of scale, 21 says the
wrong thing, 22-24 read an output whose own files were edited or replaced after it was written (or give the wrong
advice about it).
"""

from __future__ import annotations

HOSTILE_GROUPS = {
    1: "a re-run into a complete output keeps files the user added there",
    2: "files of another tool named like ours are not ours",
    3: "an output directory holding another split's shards of the same names",
    4: "an output directory that is a symlink to the input",
    5: "an input inside the output directory",
    6: "concurrent runs into one output directory (the lock)",
    7: "output paths are literal (never patterns), a blank output path",
    8: "temporaries of a crashed run",
    9: "HDF5 external raw storage: files outside the named input, FIFOs, devices",
    10: "HDF5 virtual datasets: sources outside the input's directory or missing",
    11: "paths named inside a sidecar manifest, FIFOs among shards",
    12: "values silently dropped, duplicated or unreadable; misspelled flags and keys",
    13: "declared sizes larger than the bytes present",
    14: "bombs and absurd counts: limits with flags to raise them",
    15: "decompressing the same bytes again for every row range",
    16: "a traceback instead of one error line (disk full, read-only, deep nesting, raw control characters)",
    17: "worker processes killed at any moment, or the launcher interrupted while they write (hang, orphans)",
    18: "a full disk at a collection's commit (leftovers of a failed run, recognised as ours)",
    19: "one huge row (2 GiB): refused at planning with its limit and flag, before it is read",
    20: "a pattern over very many tiny files (planning stays linear)",
    21: "messages that say the wrong thing (a complete run called incomplete, a file matched twice called unmatched)",
    22: "an output's schema.pbtxt and metadata.json that disagree (edited, replaced, missing)",
    23: "a span directory that is not the one collection.json lists (replaced, re-converted and not listed)",
    24: "an input shard that differs from its metadata at rest, reported as changed while read",
    25: "HDF5 external links: another file's data read through a name in the input, or left out without a word",
    26: "a crash of native code (SIGSEGV) instead of one error line: nesting a C parser recurses on",
}
