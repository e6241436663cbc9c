"""Which members of an archive are converted: ``--datasets`` (only these) and ``--exclude_datasets`` (all but
these), checked against the members present before any member is opened, so an excluded member (a pickled object
array, say) is never read. The flags split their value at commas; a member whose name holds a comma is named in a
YAML ``--config`` list instead (``datasets: ["a,b"]``: a list is not split), which the error for its parts says."""

from __future__ import annotations

from collections.abc import Sequence

from tfrecord_etl.transforms.errors import SourceError

MAX_NAMES_SHOWN = 20  # members listed in the error naming an unknown member


def _present(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) if "," in n else n for n in names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def select_members(
    entries: Sequence[str],
    include: Sequence[str] | None,
    exclude: Sequence[str] | None,
    path: str,
    suffix: str = ".npy",
) -> list[str]:
    """The archive entries to read, in archive order.

    Args:
      entries: the archive's member entries (``"x.npy"``), in archive order.
      include: the member names to convert (``--datasets``; ``"x"`` or ``"x.npy"``), or None for all.
      exclude: the member names to leave out (``--exclude_datasets``), or None.
      path: the archive, named in errors.
      suffix: the entry suffix a member name may omit.

    Returns:
      The selected entries: those of ``include`` (all when None) minus those of ``exclude``.

    Raises:
      SourceError: a name that no member has (one line naming the file and the members present; for a part of a
        member name holding a comma, why the flag cannot name it and the YAML list that can), or a selection that
        leaves no member.
    """
    if not include and not exclude:
        return list(entries)
    by_name = {e[: -len(suffix)] if e.endswith(suffix) else e: e for e in entries}

    def resolve(names, flag):
        out = []
        for n in names or ():
            key = n[: -len(suffix)] if n.endswith(suffix) and n not in by_name else n
            if key not in by_name:
                raise _unknown(n, flag, list(by_name), path, suffix)
            out.append(by_name[key])
        return out

    wanted = set(resolve(include, "--datasets")) if include else set(entries)
    dropped = set(resolve(exclude, "--exclude_datasets"))
    selected = [e for e in entries if e in wanted and e not in dropped]
    if not selected:
        raise SourceError(
            "--datasets and --exclude_datasets leave no member to convert",
            file=path,
            hint=f"the archive's members: {_present(list(by_name))}",
        )
    return selected


def _unknown(name: str, flag: str, members: list[str], path: str, suffix: str) -> SourceError:
    """The error for ``name`` (given with ``flag``), which no member has; when it is a part of a member name
    holding a comma, it says that the flag split that name and how to name it whole."""
    message = f"No member named '{name}' ({flag}); the archive's members: {_present(members)}"
    split = [m for m in members if "," in m and name in (p.strip() for p in m.split(","))]
    if not split:
        return SourceError(message, file=path, hint=f"pass member names as listed, without {suffix}")
    key = flag.lstrip("-")
    return SourceError(
        f"{message}; '{name}' is part of the member {split[0]!r}, whose name holds a comma, and {flag} splits its "
        "value at commas",
        file=path,
        hint=f"name it in a YAML file passed with --config, as a list, which is not split: {key}: {[split[0]]!r}",
    )
