"""The files an input pattern names (``--input``), for every source: ``planning.plan_inputs`` reads exactly these.

- **Beam's pattern syntax** (``FileSystem.translate_pattern``: ``*`` and ``?`` within a name, ``**`` across
  directories, ``[...]``). Remote patterns (gs://, s3://) and local paths without a glob character go through
  Beam's ``FileSystems.match`` (``fileio.match``); a local glob is matched by a walk of its **base directory** (the
  directory part before the first glob character, as Beam lists it), because Beam's local listing (``os.walk``)
  skips every directory symlink without a word and follows every file symlink wherever it leads.
- **Symbolic links** (to files or directories) whose target lies inside the base directory (after resolving
  symlinks: ``os.path.realpath``) are followed, so a class folder ``dog -> shared/dog`` inside the tree is read.
  A link the pattern matches (or could match below, for a directory) that leads **outside** the base is refused,
  naming it and its target, unless ``follow_symlinks`` (``--follow_symlinks``): a pattern names the paths under
  its base, and ``cat/passwd.png -> /etc/passwd`` is not one of them. A dangling link the pattern matches is
  refused too (Beam dropped it silently). A link to a directory above it (a loop) is not followed; what lies
  below it is reached by its own path. A literal path (no glob character) is followed wherever it leads: you
  named it.
- **One file, one name**: a file matched under two names (a symlink or a hard link to it, or a directory reached
  twice: the same ``st_dev`` and ``st_ino``) is refused naming both, since its rows would be converted twice.
  Refused rather than de-duplicated: which name to keep decides the ``filename`` and the label of a ``--format
  files`` Example, and a silent choice could take the wrong class.
"""

from __future__ import annotations

import logging
import os
import re

from tfrecord_etl.transforms.errors import ConfigError, SourceError, printable
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger("tfrecord_etl.transforms.collections.matching")

_GLOB = re.compile(r"[*?\[]")
_SHOWN = 3  # examples named in an error


def has_glob(pattern: str) -> bool:
    """True when ``pattern`` holds a glob character (``*``, ``?``, ``[``)."""
    return bool(_GLOB.search(pattern))


def match_inputs(pattern: str, follow_symlinks: bool = False, mtimes: dict | None = None) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of every file ``pattern`` names, sorted by path (see the module docstring).
    ``mtimes``: a dict that a local glob's walk fills with each file's ``st_mtime_ns`` from the one ``stat`` it
    makes anyway (an incremental run compares them with its ledger without a second ``stat`` per file).

    Raises:
      SourceError: nothing matches; a matched symlink leads outside the pattern's base directory (without
        ``follow_symlinks``) or to nothing; a directory that could hold matches cannot be listed; one file is
        matched under two names.
    """
    if not fileio.is_local(pattern) or not has_glob(pattern):
        return fileio.match(pattern)
    walk = _Walk(pattern, follow_symlinks)
    walk.mtimes = mtimes
    files = walk.run()
    if not files:
        raise SourceError(
            NO_MATCH, file=pattern, hint="check the path or glob; quote it so the shell does not expand it"
        )
    return files


NO_MATCH = "No input file matches the pattern"  # the message of match_inputs' "nothing matches" (its other refusals
# name what they found: a caller adding its own context to this one must not replace those)


def base_directory(pattern: str) -> str:
    """The directory a local glob is listed from: the part of ``pattern`` before its first glob character, up to
    its last ``/`` (``data/train/*/*.jpg`` -> ``data/train``; ``*.h5`` -> ``""``, the working directory)."""
    prefix = _GLOB.split(pattern, 1)[0]
    return os.path.dirname(prefix)


def inside(real: str, root: str) -> bool:
    """True when the resolved path ``real`` is ``root`` or lies below it."""
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def check_output_unmatched(pattern: str, output_dir: str, names: list[str], flag: str = "--output_dir") -> None:
    """Refuses an output directory in which ``pattern`` would match a file the run writes (``names``: shards,
    metadata, run marker, temporaries), e.g. ``--input 'tree/*/*' --output_dir tree/out``: the next run of the
    same command would read the first run's shards and metadata as inputs (of a class ``out``) and, taking them for
    an earlier run's files, delete them. Refused rather than excluded from the match: the output would stay where
    any other pattern over the tree, or another tool, reads it as input.

    Raises:
      ConfigError: naming the pattern, the output directory and a file it would match.
    """
    from apache_beam.io.filesystem import FileSystem

    if not has_glob(pattern) or fileio.is_local(pattern) != fileio.is_local(output_dir):
        return
    regex = re.compile(FileSystem.translate_pattern(pattern))
    if fileio.is_local(pattern):  # where the walk of the pattern's base would meet the output directory
        top = base_directory(pattern)
        root, real = os.path.realpath(top or "."), os.path.realpath(output_dir)
        if not inside(real, root):
            return
        rel = os.path.relpath(real, root)
        where = top if rel == "." else os.path.join(top, rel) if top else rel
    else:
        where = output_dir.rstrip("/")
    hit = next((os.path.join(where, n) for n in names if regex.match(os.path.join(where, n))), None)
    if hit is not None:
        raise ConfigError(
            f"--input matches the files this run writes in {flag} (e.g. {printable(hit)!r}): a "
            f"second run would read them as inputs",
            file=pattern,
            hint=f"write {flag} outside {printable(base_directory(pattern) or '.')!r}, or narrow the "
            f"pattern so that it cannot match there",
        )


class _Walk:
    """One walk of a local glob's base directory (see :func:`match_inputs`)."""

    def __init__(self, pattern: str, follow: bool):
        from apache_beam.io.filesystem import FileSystem

        self.pattern, self.follow = pattern, follow
        self.regex = re.compile(FileSystem.translate_pattern(pattern))
        self.top = base_directory(pattern)
        self.root = os.path.realpath(self.top or ".")
        self.parts = pattern.split("/")
        self._prefixes: dict[int, re.Pattern | None] = {}
        self.outside: list[tuple[str, str]] = []
        self.dangling: list[str] = []
        self.loops: list[str] = []
        self.unlistable: list[tuple[str, str]] = []
        self.files: dict[tuple[int, int], str] = {}
        self.twice: list[tuple[str, str]] = []
        self.mtimes: dict | None = None

    def could_match_below(self, path: str) -> bool:
        """True when the pattern could match a file below the directory ``path``: its components match the
        pattern's first ones (a ``**`` among them, or after them, can span any depth). Directories that cannot
        are not listed (Beam lists every directory below the base)."""
        n = path.count("/") + 1
        if n >= len(self.parts):
            return "**" in self.pattern
        if n not in self._prefixes:
            from apache_beam.io.filesystem import FileSystem

            prefix = "/".join(self.parts[:n])
            self._prefixes[n] = None if "**" in prefix else re.compile(FileSystem.translate_pattern(prefix))
        regex = self._prefixes[n]
        return regex is None or bool(regex.match(path))

    def run(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        stack = [(self.top, self.root, frozenset([self.root]))]
        while stack:
            directory, real_dir, ancestors = stack.pop()
            try:
                it = os.scandir(directory or ".")
            except (FileNotFoundError, NotADirectoryError):
                continue  # (the base directory does not exist: nothing matches)
            except OSError as e:
                self.unlistable.append((directory, e.strerror or str(e)))
                continue
            with it:  # each entry visited as listed: a directory of 100,000 files is not held in memory
                try:
                    for entry in it:
                        path = os.path.join(directory, entry.name) if directory else entry.name
                        self._visit(entry, path, real_dir, ancestors, stack, out)
                except OSError as e:  # the listing failed part way
                    self.unlistable.append((directory, e.strerror or str(e)))
        self._refuse()
        return sorted(out)

    def _visit(self, entry, path: str, real_dir: str, ancestors: frozenset, stack: list, out: list) -> None:
        link = entry.is_symlink()
        real = os.path.realpath(path) if link else None  # a plain directory's: below (files need none)
        try:
            is_dir = entry.is_dir()  # (follows a link)
            stat = None if is_dir else entry.stat()
        except OSError:
            if link and self.regex.match(path):
                self.dangling.append(path)
            return  # (a file that vanished while listed: as Beam)
        wanted = self.could_match_below(path) if is_dir else self.regex.match(path)
        if not wanted:
            return
        if real is None and is_dir:
            real = os.path.join(real_dir, entry.name)
        if link and not self.follow and not inside(real, self.root):
            self.outside.append((path, real))
        elif is_dir and real in ancestors:
            self.loops.append(path)
        elif is_dir:
            stack.append((path, real, ancestors | {real}))
        elif (stat.st_dev, stat.st_ino) in self.files:
            self.twice.append((self.files[(stat.st_dev, stat.st_ino)], path))
        else:
            self.files[(stat.st_dev, stat.st_ino)] = path
            out.append((path, stat.st_size))
            if self.mtimes is not None:
                self.mtimes[path] = stat.st_mtime_ns

    def _refuse(self) -> None:
        base = printable(self.top or ".")
        if self.unlistable:
            where, why = self.unlistable[0]
            raise SourceError(
                f"Cannot list the directory {printable(where or '.')!r} ({why}): files the pattern "
                f"matches there would be missed",
                file=self.pattern,
                hint="make it readable, or narrow the pattern",
            )
        if self.outside:
            shown = ", ".join(f"{printable(p)!r} -> {printable(t)!r}" for p, t in sorted(self.outside)[:_SHOWN])
            raise SourceError(
                f"Symbolic links the pattern matches lead outside its base directory {base!r} "
                f"({len(self.outside):,}: {shown}{_more(self.outside)}): not followed",
                file=self.pattern,
                hint="pass --follow_symlinks to read them, or remove the links (a "
                "pattern names the files under its base directory)",
            )
        if self.dangling:
            shown = ", ".join(repr(printable(p)) for p in sorted(self.dangling)[:_SHOWN])
            raise SourceError(
                f"Symbolic links the pattern matches point to nothing ({len(self.dangling):,}, "
                f"dangling: {shown}{_more(self.dangling)})",
                file=self.pattern,
                hint="remove them or narrow the pattern",
            )
        if self.twice:
            first, second = sorted(tuple(sorted(pair)) for pair in self.twice)[0]
            raise SourceError(
                f"Files matched under two names ({len(self.twice):,}): {printable(first)!r} and "
                f"{printable(second)!r} are the same file (a symbolic or hard link, or a directory "
                f"reached twice), whose rows would be converted twice: one file, one name",
                file=self.pattern,
                hint="remove one of the names or narrow the pattern",
            )
        if self.loops:
            log.warning(
                "%s to a directory above them not followed (a loop; what lies below is read by its own path): %s",
                _count(self.loops, "symbolic link"),
                ", ".join(repr(printable(p)) for p in sorted(self.loops)[:_SHOWN]) + _more(self.loops),
            )


def _count(items, noun: str) -> str:
    return f"{len(items):,} {noun}{'' if len(items) == 1 else 's'}"


def _more(items) -> str:
    return f" and {len(items) - _SHOWN:,} more" if len(items) > _SHOWN else ""
