"""The progress bar of convert and augment: records and bytes written of the planned total, rate and time left.

The launcher knows the plan (each shard's file name and, where planned, its records) but not what the runner's
workers are doing; what any runner leaves where the launcher can list it is the output directory. A background
thread (:class:`Watcher`) lists it every :data:`LOCAL_INTERVAL` seconds (:data:`REMOTE_INTERVAL` for gs:// and
s3://): a committed shard counts its planned records, a temporary being written (``.tmp-<32 hex>-<name key>``, see
``transforms/output/outdir.py``) its bytes at the bytes per record seen so far (the plan's estimate before the first
shard is committed), never more than its shard's records. The bar is drawn by tqdm (a dependency of the
pipelines) on the terminal the command started with (a copy of its stderr: the runner's own stderr goes to a log
file meanwhile, ``common.run_pipeline``).

Shown only when stderr is a terminal (never in Airflow's or a CI's logs) and ``--progress`` is not ``false``
(:func:`mode`). It can never fail a run: any error in the thread (a listing that fails, a terminal gone) stops the
bar silently and the run goes on. On success it ends at the planned total; on a failure it is cleared before the
error line. Object stores show a shard when its upload completes (their temporaries are not visible while being
written).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.output.sink import name_key
from tfrecord_etl.transforms.storage import fileio

LOCAL_INTERVAL = 0.5  # seconds between two listings of a local output directory
REMOTE_INTERVAL = 2.0  # of a gs:// or s3:// one (one LIST request each)
_TEMP = re.compile(r"^\.tmp-[0-9a-f]{32}-(?P<key>[0-9a-f]{8})$")  # transforms/output/sink.py's temporaries


def mode(setting: bool | None, stream=None) -> str | None:
    """How a command shows its progress: ``"bar"`` (stderr is a terminal, ``--progress`` not false), ``"lines"``
    (``--progress`` given while stderr is not a terminal: one line per shard, for logs) or None."""
    stream = sys.stderr if stream is None else stream
    if setting is False:
        return None
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        tty = False
    return "bar" if tty else ("lines" if setting else None)


@dataclass(frozen=True)
class Planned:
    """What a run will write: ``files`` maps each shard's final name to its planned records (None: not planned,
    e.g. ``--splits`` or the beam writer), ``records`` the run's total, ``bytes`` an estimate of the shards'
    total size (planning's, from the inputs), used until the first shard is committed."""

    files: dict[str, int | None]
    records: int
    bytes: int
    keys: dict[str, str] = field(default_factory=dict, compare=False)  # name key -> final name

    def __post_init__(self):
        self.keys.update({name_key(n): n for n in self.files})


def measure(planned: Planned, listing: dict[str, int], before: frozenset = frozenset()) -> tuple[int, int]:
    """``(records, bytes)`` written so far, from ``listing`` (``{name: size}`` of the output directory's files);
    ``before``: names that were there when the run started (an earlier output's), not counted.

    A committed shard counts its planned records (unknown: its bytes at the average bytes per record); a
    temporary its bytes at the bytes per record of the committed shards (the plan's estimate before one is),
    at most its shard's planned records. Never more than ``planned.records``."""
    per_record = planned.bytes / planned.records if planned.records else 0.0
    committed = [(name, size) for name, size in listing.items() if name in planned.files and name not in before]
    known = [(planned.files[n], s) for n, s in committed if planned.files[n] is not None]
    if known and sum(r for r, _ in known) > 0:
        per_record = sum(s for _, s in known) / sum(r for r, _ in known)
    records = nbytes = 0
    for name, size in committed:
        rows = planned.files[name]
        records += rows if rows is not None else (int(size / per_record) if per_record else 0)
        nbytes += size
    done = {n for n, _ in committed}
    writing: dict[str, int] = {}
    for name, size in listing.items():
        m = _TEMP.match(name)
        final = planned.keys.get(m.group("key")) if m else None
        if final is None or final in done:
            continue
        writing[final] = max(writing.get(final, 0), size)  # duplicate attempts of one shard: the furthest
    for final, size in writing.items():
        rows = int(size / per_record) if per_record else 0
        cap = planned.files[final]
        records += min(rows, cap) if cap is not None else rows
        nbytes += size
    return min(records, planned.records), nbytes


def list_sizes(directory: str) -> dict[str, int]:
    """``{name: size}`` of the files directly in ``directory`` (local ``os.scandir``, else one listing)."""
    if fileio.is_local(directory):
        out = {}
        with os.scandir(directory) as it:
            for entry in it:
                with contextlib.suppress(OSError):  # renamed or deleted between the listing and the stat
                    out[entry.name] = entry.stat().st_size
        return out
    base = directory.rstrip("/") + "/"
    return {
        path[len(base) :]: int(size or 0)
        for path, size in fileio.find(fileio.join(fileio.escape_glob(directory), "*"))
        if path.startswith(base) and "/" not in path[len(base) :]
    }


def _width(stream) -> int | None:
    """None when ``stream``'s terminal reports its width (tqdm follows it), else 100 columns."""
    try:
        return None if os.get_terminal_size(stream.fileno()).columns > 0 else 100
    except (AttributeError, OSError, ValueError):
        return 100


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Watcher:
    """The bar and its polling thread for one run writing ``planned`` into ``output_dir``.

    ``start()`` draws it and starts the thread; ``finish()`` (the run succeeded) ends it at the planned total;
    ``abort()`` (it failed) clears it. ``stream``: where to draw (default: a copy of stderr's descriptor, taken
    before the runner sends stderr to its log); ``interval``: seconds between listings."""

    def __init__(
        self,
        output_dir: str,
        planned: Planned,
        label: str,
        stream=None,
        interval: float | None = None,
        lister=list_sizes,
    ):
        self.output_dir, self.planned, self.label, self._lister = output_dir, planned, label, lister
        self.interval = (
            interval if interval is not None else (LOCAL_INTERVAL if fileio.is_local(output_dir) else REMOTE_INTERVAL)
        )
        self._own_stream = stream is None
        self._stream = stream
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._before: frozenset = frozenset()
        self.failed: BaseException | None = None  # what stopped the bar early (kept for the tests)

    def start(self) -> Watcher:
        try:
            from tqdm import tqdm

            if self._stream is None:
                self._stream = os.fdopen(
                    os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8", errors="replace"
                )
            with contextlib.suppress(Exception):
                self._before = frozenset(self._lister(self.output_dir))
            width = _width(self._stream)  # a terminal that reports no width (0 columns) gets 100
            self._bar = tqdm(
                total=self.planned.records,
                desc=self.label,
                unit=" records",
                unit_scale=self.planned.records >= 100_000,
                file=self._stream,
                dynamic_ncols=width is None,
                ncols=width,
                mininterval=0.2,
                leave=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} records{postfix} "
                "[{elapsed}<{remaining}, {rate_fmt}]",
            )
            self._set(0, 0)
            self._thread = threading.Thread(target=self._poll, name="tfrecord-etl-progress", daemon=True)
            self._thread.start()
        except Exception as e:  # noqa: BLE001 - a bar never fails a run
            self._give_up(e)
        return self

    def _set(self, records: int, nbytes: int) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.postfix = f"{_size(nbytes)} of ~{_size(max(nbytes, self.planned.bytes))}"
        if records > bar.n:
            bar.update(records - bar.n)
        else:
            bar.refresh()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                counts = measure(self.planned, self._lister(self.output_dir), self._before)
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._set(*counts)
            except Exception as e:  # noqa: BLE001 - the bar stops, the run goes on
                self._give_up(e)
                return

    def _give_up(self, error: BaseException) -> None:
        self.failed = error
        self._stop.set()
        with self._lock:
            self._close(leave=False)

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def finish(self) -> None:
        """The run succeeded: the bar shows the planned total and the bytes written, and stays on its line."""
        self._halt()
        with self._lock:
            if self._bar is not None:
                try:
                    nbytes = measure(self.planned, self._lister(self.output_dir), self._before)[1]
                except Exception:  # noqa: BLE001
                    nbytes = 0
                with contextlib.suppress(Exception):
                    self._set(self.planned.records, nbytes)
            self._close(leave=True)

    def abort(self) -> None:
        """The run failed: the bar is cleared, so that the error line stands alone."""
        self._halt()
        with self._lock:
            self._close(leave=False)

    def _close(self, leave: bool) -> None:
        bar, self._bar = self._bar, None
        with contextlib.suppress(Exception):
            if bar is not None:
                bar.leave = leave
                bar.close()
        with contextlib.suppress(Exception):
            if self._stream is not None:
                self._stream.flush()
                if self._own_stream:
                    self._stream.close()
        self._stream = None


@contextlib.contextmanager
def watch(output_dir: str, planned: Planned, label: str, enabled: bool, stream=None) -> Iterator[Watcher | None]:
    """Shows the bar of a run writing ``planned`` into ``output_dir`` while the block runs (when ``enabled``; on
    ``stream``, default a copy of stderr): ends at the total when the block returns, cleared when it raises (the
    error propagates)."""
    if not enabled:
        yield None
        return
    watcher = Watcher(output_dir, planned, label, stream=stream).start()
    try:
        yield watcher
    except BaseException:
        watcher.abort()
        raise
    watcher.finish()


def convert_planned(plan) -> Planned:
    """The :class:`Planned` of a ``planning.ConvertPlan``: its shard files (``--index`` files aside), each with its
    planned rows where the planned writer writes one file per shard plan."""
    index_names = {tfrecord.index_name(f) for f in plan.output_files}
    shards = [f for f in plan.output_files if f not in index_names]
    if plan.shards is not None and plan.split_plan is None and len(plan.shards) == len(shards):
        files = {name: s.num_rows for name, s in zip(shards, plan.shards)}
        nbytes = sum(s.num_bytes for s in plan.shards)
    else:
        files = dict.fromkeys(shards)
        nbytes = plan.inputs.num_bytes
    return Planned(files, plan.inputs.num_rows, nbytes)


def augment_planned(plan, records: int, nbytes: int) -> Planned:
    """The :class:`Planned` of an ``augment.AugmentPlan``: each output shard with its input shard's records (from
    the input's metadata; None without); ``records`` and ``nbytes``: the run's totals (``augment_size``)."""
    return Planned({s.output_file: s.records for s in plan.collection.shards}, records, nbytes)
