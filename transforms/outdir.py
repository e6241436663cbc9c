"""The output directory: its file names, which files in it are ours, the run marker, the lock, and the
rules for what a run may delete or replace (issue 10). Every command that writes an output directory
(convert, augment) goes through :func:`prepare`; nothing else deletes files there.

The guarantees:

- **Only our files are ever deleted or replaced.** A file is ours when the directory's run marker
  (``.tfrecord-etl-run.json``, written before the first shard) or its ``metadata.json`` lists it, or it
  is a temporary of such a file (``.tmp-<listed name>-<hex>``) or the Beam temp dir of a listed run
  (``beam-temp-<prefix>-<hex>``). Names alone never make a file ours: another tool's
  ``data-00000-of-00002.tfrecord.gz`` in a directory without our marker is not ours.
- **Anything else makes a run refuse** unless ``--overwrite``; with ``--overwrite`` our files are
  deleted and the others kept (and named). A file of someone else's with the name of a file this run
  writes is never replaced, ``--overwrite`` or not.
- **Paths are literal.** The output directory is never globbed (``o[ab]`` is a directory name, not a
  pattern): local directories are listed with ``os.scandir``, remote ones with the glob characters of
  the directory escaped.
- **Inputs are never inside the output directory** (checked with ``os.path.realpath``: symlinks too).
- **One run at a time**: an exclusive lock file ``.tfrecord-etl.lock`` (``O_CREAT|O_EXCL``) holds the
  host, pid and process start time of the launcher; a lock whose process is gone (same host) is stale
  and taken over. On object stores the lock is best effort (write, then read back our run id).
- **Every deletion is printed** on stderr at the default log level.

The model is TFDS's ``incomplete_file`` and Beam's ``FileBasedSink.finalize_write``: temporaries under
names of their own, renamed when complete, and only a list of known names cleaned up.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import socket
import sys
import uuid
from typing import Iterable

from tfrecord_etl.transforms import fileio
from tfrecord_etl.transforms.errors import ConfigError

METADATA_FILE = "metadata.json"
SCHEMA_FILE = "schema.pbtxt"
MANIFEST_FILE = "manifest.json"
SIDECAR_FORMAT = "tfrecord-etl-sidecar/1"  # the "format" of a sidecar collection's manifest.json
MARKER_FILE = ".tfrecord-etl-run.json"
LOCK_FILE = ".tfrecord-etl.lock"
TEMP_PREFIX = ".tmp-"
MARKER_FORMAT = "tfrecord-etl-run/1"
_MAX_JSON_BYTES = 64 * 2**20  # a marker or metadata.json larger than this is not ours
_TEMP = re.compile(r"^\.tmp-(?P<name>.+)-[0-9a-f]{32}$")
_BEAM_TEMP = re.compile(r"^beam-temp-(?P<prefix>.+)-[0-9a-f]{32}$")
_GLOB_CHARS = re.compile(r"([*?\[\]])")


def say(message: str) -> None:
    """One line on stderr, shown at the default log level (deletions, kept files, stale locks)."""
    print(f"[tfrecord-etl] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- literal paths

def escape_glob(path: str) -> str:
    """``path`` with ``*``, ``?``, ``[`` and ``]`` made literal for Beam's ``FileSystems.match``."""
    return _GLOB_CHARS.sub(r"[\1]", path)


def list_names(directory: str) -> dict[str, str]:
    """``{name: path}`` of the direct children of ``directory`` (files and directories), never globbed.

    Local: ``os.scandir``. Remote: ``FileSystems.match`` of the escaped directory + ``*``; children of
    sub-directories are folded into the sub-directory's name.
    """
    if fileio.is_local(directory):
        if not os.path.isdir(directory):
            return {}
        with os.scandir(directory) as it:
            return {e.name: e.path for e in it}
    try:
        found = fileio.FileSystems.match([fileio.join(escape_glob(directory), "*")])[0].metadata_list
    except Exception:  # noqa: BLE001 - an empty prefix is "no match" on some filesystems
        return {}
    base = directory.rstrip("/") + "/"
    out = {}
    for m in found:
        rest = m.path[len(base):] if m.path.startswith(base) else fileio.basename(m.path)
        name = rest.split("/", 1)[0]
        if name:
            out[name] = fileio.join(directory, name)
    return out


MAX_NESTED_CHECKS = 1000  # sub-directories looked into for a metadata.json (a limit, not a walk)


def nested_outputs(directory: str) -> list[str]:
    """Names of the direct sub-directories of ``directory`` that are complete outputs (hold ``metadata.json``),
    sorted; at most :data:`MAX_NESTED_CHECKS` children are looked into."""
    names = sorted(list_names(directory).items())[:MAX_NESTED_CHECKS]
    return [n for n, path in names if fileio.exists(fileio.join(path, METADATA_FILE))]


def delete_names(directory: str, names: Iterable[str]) -> None:
    """Deletes the children ``names`` of ``directory`` (directories recursively), each by its exact path."""
    import shutil
    for name in names:
        path = fileio.join(directory, name)
        if fileio.is_local(directory):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        elif fileio.exists(path):
            fileio.FileSystems.delete([path])


# ---------------------------------------------------------------- checks

def check_output_path(output_dir: str) -> None:
    """Refuses an output directory that cannot be one: empty, a file, a dangling symlink, not writable.

    Raises:
      ConfigError: naming the path and what to do.
    """
    if not output_dir or not output_dir.strip():
        raise ConfigError("--output_dir is empty", hint="name a directory, e.g. --output_dir out/")
    if not fileio.is_local(output_dir):
        return
    if os.path.islink(output_dir) and not os.path.exists(output_dir):
        raise ConfigError("--output_dir is a symbolic link to nothing (dangling)", file=output_dir,
                          hint="remove the link or point --output_dir at a directory")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError("--output_dir exists and is not a directory", file=output_dir,
                          hint="choose a directory path")
    parent = output_dir if os.path.isdir(output_dir) else _existing_parent(output_dir)
    if parent is not None and not os.path.isdir(parent):
        raise ConfigError(f"A parent of --output_dir is not a directory: {parent}", file=output_dir)
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError("The output directory is not writable (read-only file system or no permission)",
                          file=parent, hint="choose a writable --output_dir")


def _existing_parent(path: str) -> str | None:
    path = os.path.abspath(path)
    while path and not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return path


def check_inputs_outside(output_dir: str, paths: Iterable[str], what: str = "An input file") -> None:
    """Refuses any of ``paths`` that lies inside ``output_dir`` (after resolving symlinks), since a run
    may delete our files there and its inputs must never be touched.

    Raises:
      ConfigError: naming the first such path.
    """
    if fileio.is_local(output_dir):
        root = os.path.realpath(output_dir)
        for p in paths:
            if fileio.is_local(p):
                real = os.path.realpath(p)
                if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                    raise ConfigError(f"{what} is inside --output_dir (resolved: {real})", file=p,
                                      hint="write the output to another directory; inputs are never modified")
        return
    root = output_dir.rstrip("/") + "/"
    for p in paths:
        if p.rstrip("/") + "/" == root or p.startswith(root):
            raise ConfigError(f"{what} is inside --output_dir", file=p,
                              hint="write the output to another directory; inputs are never modified")


# ---------------------------------------------------------------- what is ours

def _read_json(path: str) -> dict | None:
    try:
        if fileio.is_local(path):
            if not os.path.isfile(path) or os.path.getsize(path) > _MAX_JSON_BYTES:
                return None
        data = json.loads(fileio.read_bytes(path))
    except Exception:  # noqa: BLE001 - unreadable: not ours
        return None
    return data if isinstance(data, dict) else None


def _plain_names(values) -> set[str]:
    out = set()
    for v in values if isinstance(values, list) else ():
        if isinstance(v, str) and v and "/" not in v and "\\" not in v and v not in (".", ".."):
            out.add(v)
    return out


@dataclasses.dataclass(frozen=True)
class Owned:
    """What an output directory's marker and metadata say about it.

    Attributes:
      files: names of files ours (listed by the marker or metadata.json).
      beam_prefixes: shard prefixes whose ``beam-temp-<prefix>-<hex>`` dirs are ours.
      complete: metadata.json is there and parses.
      options: the options recorded by metadata.json (or the marker) of the last run.
    """
    files: frozenset
    beam_prefixes: frozenset
    complete: bool
    options: dict | None

    def is_ours(self, name: str) -> bool:
        if name in self.files:
            return True
        m = _TEMP.match(name)
        if m and m.group("name") in self.files:
            return True
        m = _BEAM_TEMP.match(name)
        return bool(m and m.group("prefix") in self.beam_prefixes)


def owned(output_dir: str, names: Iterable[str]) -> Owned:
    """Reads the marker and ``metadata.json`` of ``output_dir`` (whose children are ``names``)."""
    names = set(names)
    files: set[str] = set()
    prefixes: set[str] = set()
    options = None
    marker = _read_json(fileio.join(output_dir, MARKER_FILE)) if MARKER_FILE in names else None
    if marker is not None and marker.get("format") == MARKER_FORMAT:
        files |= _plain_names(marker.get("files")) | {MARKER_FILE}
        prefixes |= _plain_names(marker.get("beam_temp_prefixes"))
        options = marker.get("options") if isinstance(marker.get("options"), dict) else None
    meta = _read_json(fileio.join(output_dir, METADATA_FILE)) if METADATA_FILE in names else None
    complete = False
    if meta is not None and isinstance(meta.get("format"), str) and meta["format"].startswith("tfrecord-etl/"):
        shards = meta.get("shards") if isinstance(meta.get("shards"), list) else []
        files |= _plain_names([s.get(key) for s in shards if isinstance(s, dict) for key in ("file", "index")])
        if isinstance(meta.get("tfds"), dict):  # TFDS's dataset_info.json, features.json (--tfds_name)
            files |= _plain_names(meta["tfds"].get("files"))
        files |= {METADATA_FILE, SCHEMA_FILE} | ({MANIFEST_FILE} if isinstance(meta.get("augment"), dict) and
                                                 meta["augment"].get("mode") == "sidecar" else set())
        complete = True
        options = meta.get("options") if isinstance(meta.get("options"), dict) else options
    files |= {f".{name}.tmp" for name in (METADATA_FILE, MANIFEST_FILE) if name in files}
    return Owned(frozenset(files), frozenset(prefixes), complete, options)


# ---------------------------------------------------------------- the lock

def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc/<pid>/stat`` field 22), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"
        return "?"


def _lock_record(run_id: str) -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid), "run_id": run_id,
            "since": _now()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _is_stale(record: dict | None, path: str) -> bool:
    if record is None:  # empty or torn (a launcher killed between create and write): stale after a minute
        if fileio.is_local(path):
            import time
            try:
                return time.time() - os.path.getmtime(path) > 60
            except OSError:
                return True
        return False
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    start = _process_start(record["pid"])
    return start is None or (start != "?" and record.get("start") not in (None, "?") and start != record["start"])


class Lock:
    """The exclusive lock of one run on an output directory (a context manager; released on exit)."""

    def __init__(self, output_dir: str, run_id: str):
        self.path = fileio.join(output_dir, LOCK_FILE)
        self.run_id = run_id
        self.held = False

    def acquire(self) -> "Lock":
        """Raises ConfigError when another live run holds the lock."""
        record = _lock_record(self.run_id)
        data = json.dumps(record).encode()
        for attempt in range(2):
            if fileio.is_local(self.path):
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    self.held = True
                    return self
            elif not fileio.exists(self.path):
                fileio.write_bytes(self.path, data)
                if (_read_json(self.path) or {}).get("run_id") == self.run_id:
                    self.held = True
                    return self
            other = _read_json(self.path)
            if attempt == 0 and _is_stale(other, self.path):
                say(f"taking over the stale lock {self.path} of a run that is gone ({_describe(other)})")
                delete_names(os.path.dirname(self.path) if fileio.is_local(self.path) else
                             self.path.rsplit("/", 1)[0], [LOCK_FILE])
                continue
            raise ConfigError(f"Another run ({_describe(other)}) is writing this output directory", file=self.path,
                              hint="wait for it to finish or choose another --output_dir; if no such run exists, "
                                   f"delete {LOCK_FILE}")
        raise AssertionError("unreachable")

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                if (_read_json(self.path) or {}).get("run_id") == self.run_id:
                    fileio.delete([self.path])
            except Exception:  # noqa: BLE001 - a lock left behind is stale for the next run
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _describe(record: dict | None) -> str:
    if not record:
        return "unknown: the lock file is empty or unreadable"
    return f"host {record.get('host')}, pid {record.get('pid')}, since {record.get('since')}"


# ---------------------------------------------------------------- prepare

def _comparable(options: dict | None) -> dict | None:
    if options is None:
        return None
    return {k: v for k, v in options.items() if k not in ("overwrite", "verbose", "progress")}


def _count(items, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names_list(names: Iterable[str], n: int = 3) -> str:
    from tfrecord_etl.transforms.errors import printable
    names = sorted(names)
    shown = ", ".join(printable(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def prepare(output_dir: str, *, command: str, options: dict, files: Iterable[str], overwrite: bool,
            beam_temp_prefixes: Iterable[str] = (), keep: Iterable[str] = ()) -> Lock:
    """Makes ``output_dir`` ready for a run that writes ``files`` (names) and returns the run's held
    :class:`Lock` (use it as a context manager around the pipeline).

    - missing or empty: created;
    - holds only our files (a crashed run, or a complete run of the same ``options``): they are removed;
    - a complete output of other options: refused unless ``overwrite``;
    - holds files that are not ours: refused unless ``overwrite``; with it, ours are removed and the
      others kept;
    - a file that is not ours but has the name of one of ``files``: always refused.
    The metadata is removed first, so a crash during cleanup never leaves a complete-looking output; then
    the run marker listing ``files`` is written.

    ``keep``: names of our files this run adds to rather than replaces (the other splits of a TFDS directory, and
    its metadata while a new split is written: ``convert.carried_splits``); they are never deleted, and the
    directory's earlier options do not make the run refuse.

    Raises:
      ConfigError: any refusal above, an unusable path, or another live run holding the lock.
    """
    check_output_path(output_dir)
    files = set(files) | {METADATA_FILE, SCHEMA_FILE}
    run_id = uuid.uuid4().hex
    if fileio.is_local(output_dir):
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"Cannot create the output directory: {e.strerror}", file=output_dir) from None
    lock = Lock(output_dir, run_id)
    try:
        lock.acquire()
    except OSError as e:
        raise ConfigError(f"Cannot write in the output directory: {e.strerror}", file=output_dir,
                          hint="choose a writable --output_dir") from None
    try:
        _clear(output_dir, options, files, overwrite, set(keep))
        marker = {"format": MARKER_FORMAT, "run_id": run_id, "command": command, "created": _now(),
                  "host": socket.gethostname(), "pid": os.getpid(), "files": sorted(files),
                  "beam_temp_prefixes": sorted(set(beam_temp_prefixes)), "options": options}
        from tfrecord_etl.transforms import sink  # sink imports this module's names
        sink.write_json(fileio.join(output_dir, MARKER_FILE), marker, default=str)
    except BaseException:
        lock.release()
        raise
    return lock


def _clear(output_dir: str, options: dict, files: set[str], overwrite: bool, keep: set[str] = frozenset()) -> None:
    names = set(list_names(output_dir)) - {LOCK_FILE}
    if not names:
        return
    own = owned(output_dir, names)
    ours = {n for n in names if own.is_ours(n)}
    kept = ours & keep
    ours -= keep
    strangers = names - ours - kept
    clashes = strangers & (files | {MARKER_FILE})
    if clashes:
        raise ConfigError(f"The output directory holds files tfrecord-etl did not write with the names this run "
                          f"writes ({_names_list(clashes)})", file=output_dir,
                          hint="they are never replaced, --overwrite or not: move them away or choose another "
                               "--output_dir")
    if strangers and not overwrite:
        raise ConfigError(f"The output directory holds files tfrecord-etl did not write ({_names_list(strangers)})",
                          file=output_dir, hint="pass --overwrite to replace tfrecord-etl's files there (the others "
                                                "are kept), or choose another --output_dir")
    if own.complete and not overwrite and not kept and _comparable(own.options) != _comparable(options):
        raise ConfigError("The output directory holds a complete output of another run", file=output_dir,
                          hint="pass --overwrite to replace it, or choose another --output_dir")
    if ours:
        order = [n for n in (METADATA_FILE,) if n in ours] + sorted(ours - {METADATA_FILE, MARKER_FILE})
        order += [MARKER_FILE] if MARKER_FILE in ours else []
        say(f"removing {_count(ours, 'file')} of an earlier run in {output_dir}: {_names_list(order, 5)}")
        delete_names(output_dir, order)
    if kept:
        say(f"keeping {_count(kept, 'file')} of the splits already in {output_dir}: {_names_list(kept, 5)}")
    if strangers:
        say(f"keeping {_count(strangers, 'file')} tfrecord-etl did not write in {output_dir}: "
            f"{_names_list(strangers, 5)}")


def record_shards(output_dir: str, shards: Iterable[dict]) -> None:
    """Adds to the run marker, just before ``metadata.json`` is written, each committed shard it lists, with its
    record count, size (bytes) and CRC32C: the marker then says what this run's shards are, not only their names.
    Nothing is written when the directory has no marker of ours or it lists none of ``shards`` (a pipeline built
    without ``prepare``)."""
    path = fileio.join(output_dir, MARKER_FILE)
    marker = _read_json(path)
    if marker is None or marker.get("format") != MARKER_FORMAT:
        return
    listed = _plain_names(marker.get("files"))
    entries = [{k: s[k] for k in ("file", "records", "bytes", "crc32c", "index", "split") if k in s}
               for s in shards if s.get("file") in listed]
    if entries:
        from tfrecord_etl.transforms import sink  # sink imports this module's names
        sink.write_json(path, {**marker, "shards": entries}, default=str)


def remove_temporaries(output_dir: str, files: Iterable[str]) -> None:
    """Deletes the ``.tmp-<name>-<hex>`` temporaries of ``files`` (killed or duplicate attempts), by exact name."""
    files = set(files)
    stale = [n for n in list_names(output_dir) if (m := _TEMP.match(n)) and m.group("name") in files]
    if stale:
        say(f"removing {_count(stale, 'temporary file')} of killed or duplicate attempts in {output_dir}: "
            f"{_names_list(stale, 5)}")
        delete_names(output_dir, stale)
