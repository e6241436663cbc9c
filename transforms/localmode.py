"""``--direct_running_mode auto``: how DirectRunner runs a command, chosen from the plan (rows, bytes, shards,
CPUs). The default of our commands on DirectRunner (Beam's own default is in_memory); an explicit mode wins.
``pipelines.common.local_runner`` then builds the FnApiRunner with the chosen options.
"""

from __future__ import annotations

import dataclasses
import os

DIRECT_NAMES = (None, "", "DirectRunner", "direct", "SwitchingDirectRunner")

# --direct_running_mode auto (the default of our commands on DirectRunner): worker processes only where they pay
# off. Measured on the benchmark's inputs (bench/run.sh --only sizes, 2-core machine kind, docs/performance.md):
# starting 2 worker processes costs ~2.5 s of wall and ~3 CPU-s; the in-process runner encodes ~3M small rows/s,
# 2 processes ~4.5M/s, so processes win above ~20M rows (1 GB of 72-byte rows: 14M rows, in-process 6.6-7.2 s,
# 2 processes 7.8 s; 8 GB, 111M rows: 43.8 s vs 32.5 s). Rows of kilobytes are bound by reading and writing the
# page cache, where processes never won (8 GB of 12.8 KB rows: in-process 8.7-9.2 s, 2 processes 13.4-14.5 s).
AUTO_MIN_ROWS = 25_000_000  # rows of input at which auto starts worker processes
AUTO_MAX_ROW_BYTES = 4096  # ... when rows average at most this many bytes (encoding-bound, not I/O-bound)
# In-process, auto keeps up to one bundle per CPU (--direct_num_workers): Beam's FnApiRunner then runs that many
# bundles at once on threads (its ParallelBundleManager), which matched multi_threading and beat one bundle from
# 1 GB up (bench sizes, best of 3: 8 GB of large rows 11.7 s vs 18.5 s; 8 GB of small rows 34.9 s vs 46.7 s).


@dataclasses.dataclass(frozen=True)
class LocalMode:
    """How DirectRunner runs a command: ``mode`` (Beam's ``direct_running_mode``), ``workers``, ``reason``."""

    mode: str
    workers: int
    reason: str

    def describe(self) -> str:
        if self.mode == "in_memory":
            workers = f", {self.workers} parallel bundles (threads)" if self.workers > 1 else ""
        else:
            workers = f", {self.workers} workers"
        return f"{self.mode}{workers} ({self.reason})"


def without_auto(beam_argv: list[str]) -> list[str]:
    """``beam_argv`` without ``--direct_running_mode auto`` (a value Beam does not know): a mode left unset is
    auto (:func:`choose_local_mode`)."""
    out, i = [], 0
    argv = [str(a) for a in beam_argv]
    while i < len(argv):
        token = argv[i]
        if token == "--direct_running_mode" and i + 1 < len(argv):
            if argv[i + 1] != "auto":
                out += [token, argv[i + 1]]
            i += 2
            continue
        if token != "--direct_running_mode=auto":
            out.append(token)
        i += 1
    return out


def _mode_given(beam_argv: list[str]) -> bool:
    return any(str(a) == "--direct_running_mode" or str(a).startswith("--direct_running_mode=") for a in beam_argv)


def choose_local_mode(
    beam_argv: list[str], num_rows: int, num_bytes: int, max_workers: int, cpus: int | None = None
) -> tuple[list[str], LocalMode | None]:
    """Resolves the local mode for a job of ``num_rows`` rows and ``num_bytes`` bytes (of input) that can use at
    most ``max_workers`` workers (its rows, or its shards): with no ``--direct_running_mode`` (auto), in-process
    unless the job is encoding-bound and large enough to pay for starting worker processes (``AUTO_MIN_ROWS``,
    ``AUTO_MAX_ROW_BYTES``); an explicit mode wins. Returns the Beam argv to run with and the mode (None off
    DirectRunner).
    """
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions(beam_argv)
    if options.view_as(StandardOptions).runner not in DIRECT_NAMES:
        return beam_argv, None
    direct = options.view_as(DirectOptions)
    if _mode_given(beam_argv):
        mode = direct.direct_running_mode or "in_memory"
        return beam_argv, LocalMode(mode, direct.direct_num_workers or 1, "as asked")
    cpus = cpus or os.cpu_count() or 1
    row_bytes = num_bytes / max(1, num_rows)
    asked = direct.direct_num_workers if any(str(a).startswith("--direct_num_workers") for a in beam_argv) else None
    workers = min(asked or cpus, max(1, max_workers))
    if workers < 2:
        mode = LocalMode(
            "in_memory",
            1,
            "auto: one CPU or one shard" if cpus < 2 or max_workers < 2 else "auto: --direct_num_workers 1",
        )
    elif num_rows < AUTO_MIN_ROWS:  # in-process; the FnApiRunner runs `workers` bundles at once (threads)
        mode = LocalMode(
            "in_memory",
            workers,
            f"auto: {num_rows:,} rows, below the {AUTO_MIN_ROWS:,} where starting worker processes pays off",
        )
    elif row_bytes > AUTO_MAX_ROW_BYTES:
        mode = LocalMode(
            "in_memory",
            workers,
            f"auto: rows of {row_bytes:,.0f} bytes are bound by reading and "
            "writing, where worker processes do not help",
        )
    else:
        mode = LocalMode("multi_processing", workers, f"auto: {num_rows:,} rows of {row_bytes:,.0f} bytes")
    argv = list(beam_argv) + [f"--direct_running_mode={mode.mode}"]
    if mode.workers > 1 and not asked:
        argv.append(f"--direct_num_workers={mode.workers}")
    return argv, mode
