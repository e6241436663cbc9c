"""Links of an HDF5 file: soft links (a name for another object of the same file) and external links (a name for an
object of another file, ``h5py.ExternalLink``). An external link is read under the rule of external raw storage
(``hdf5storage.check_storage``): refused unless ``--allow_external_storage``, and then followed only when its file is a
regular file inside the input file's own directory (resolved there, never against the working directory, symlinks
resolved). The name of a dataset (``--datasets``, or a name found by the walk) is resolved here one component at a
time, so that an external link anywhere on the way (``/entry/data`` linking a group of another file) is seen and
checked before HDF5 opens anything outside the input.

HDF5's own resolution of an external link's file name (``H5Lcreate_external``: the ``HDF5_EXT_PREFIX`` variable,
the link-access prefix, the working directory) is never used: the checked file is opened by its real path.
"""

from __future__ import annotations

import os
import stat

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.storage import fileio

MAX_LINK_HOPS = 40  # soft and external links followed while resolving one name (a loop of links ends here)
FLAG = "--allow_external_storage"


def external_target(link, path: str, allow: bool, dataset: str) -> str:
    """The real path of the file an ``h5py.ExternalLink`` found in the input ``path`` names, checked: a regular file
    inside the input's directory, and ``allow`` (``--allow_external_storage``) given.

    Raises:
      SourceError: ``allow`` not given, a remote input, a file outside the input's directory, missing (a dangling
        link) or not a regular file; naming the input, the link (``dataset``), its target and the flag.
    """
    target = f"{link.filename}:{link.path}"
    why = link_status(link, path, allow)
    if why is None:
        return os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(path)), link.filename))
    if why.startswith("needs"):
        raise SourceError(
            f"The name is an external link to {target!r}, in another file: refused, never read",
            file=path,
            dataset=dataset,
            hint=f"pass {FLAG} to follow external links to files in the input file's own directory "
            f"(or use h5repack to copy the data into the file)",
        )
    if why == "remote input":
        raise SourceError(
            f"External links of a remote HDF5 file are not followed (to {target!r})",
            file=path,
            dataset=dataset,
            hint="copy the file and the files it links to into one local directory",
        )
    if why.startswith("outside"):
        raise SourceError(
            f"The name is an external link to {target!r}, whose file lies outside the input file's "
            f"directory: refused, never read",
            file=path,
            dataset=dataset,
            hint="move the linked file next to the HDF5 file (external links are followed, with "
            f"{FLAG}, only there), or use h5repack to copy the data into the file",
        )
    what = "missing (a dangling link)" if why.startswith("dangling") else why
    raise SourceError(
        f"The name is an external link to {target!r}, whose file is {what}: refused",
        file=path,
        dataset=dataset,
        hint="put the linked file next to the HDF5 file, or choose other datasets with --datasets",
    )


def link_status(link, path: str, allow: bool) -> str | None:
    """Why the external link ``link`` of the input ``path`` is not followed (``outside the input's directory``,
    ``dangling: its file is missing``, ``not a regular file``, ``remote input``, ``needs --allow_external_storage``),
    or None when it is followed (for the walk's warning and ``inspect``)."""
    if not fileio.is_local(path):
        return "remote input"
    base = os.path.dirname(os.path.realpath(path))
    real = os.path.realpath(os.path.join(base, link.filename))
    if not real.startswith(base.rstrip(os.sep) + os.sep):
        return "outside the input's directory"
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return "dangling: its file is missing"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, device or directory)"
    return None if allow else f"needs {FLAG}"


def resolve(f, name: str, path: str, allow: bool, dataset: str | None = None):
    """The object ``name`` of the open h5py file ``f`` (the input ``path``), resolved one link at a time: hard links
    as HDF5 does, soft links within their file, external links checked by :func:`external_target` and opened by
    their checked real path. ``allow``: ``--allow_external_storage``.

    Returns:
      The h5py object (a Dataset or Group; one reached through an external link belongs to the file opened for it,
      kept open by the object).

    Raises:
      KeyError: no object of that name (a dangling soft link included).
      SourceError: an external link refused (see :func:`external_target`), or more than :data:`MAX_LINK_HOPS`
        links followed (a loop).
    """
    import h5py

    dataset = dataset or name
    parts = [p for p in name.split("/") if p]
    group, hops = f, 0
    while parts:
        key = parts.pop(0)
        if key == ".":
            continue
        if not isinstance(group, h5py.Group):
            raise KeyError(name)
        link = group.get(key, getlink=True)
        if link is None:
            raise KeyError(name)
        if isinstance(link, h5py.HardLink):
            group = group[key]
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise SourceError(
                f"Resolving the name followed more than {MAX_LINK_HOPS} links (a loop of links?)",
                file=path,
                dataset=dataset,
            )
        if isinstance(link, h5py.SoftLink):
            target = link.path
            if target.startswith("/"):
                group = group.file
            parts = [p for p in target.split("/") if p] + parts
            continue
        if isinstance(link, h5py.ExternalLink):
            real = external_target(link, path, allow, dataset)
            try:
                other = h5py.File(real, "r")
            except Exception as e:  # noqa: BLE001 - not HDF5, damaged
                raise SourceError(
                    f"The external link's file {link.filename!r} is not a readable HDF5 file: {e}",
                    file=path,
                    dataset=dataset,
                ) from None
            group = other
            parts = [p for p in link.path.split("/") if p] + parts
            continue
        raise KeyError(name)  # a user-defined link class
    return group


def has_links(f, name: str) -> bool:
    """True when a component of ``name`` in ``f`` is not a hard link (so :func:`resolve` must open it)."""
    import h5py

    group = f
    for key in (p for p in name.split("/") if p):
        if not isinstance(group, h5py.Group):
            return False
        link = group.get(key, getlink=True)
        if link is None:
            return False
        if not isinstance(link, h5py.HardLink):
            return True
        group = group[key]
    return False


def followed_dataset(f, full: str, link, path: str, allow: bool, skipped: dict):
    """The dataset an external link found by the walk names, when it is followed (``allow``:
    ``--allow_external_storage``, and its file a regular file in the input's directory); else None, and the link is
    added to ``skipped`` under the reason (one warning line names it)."""
    import h5py

    why = link_status(link, path, allow)
    target = None
    if why is None:
        try:
            target = resolve(f, full, path, True)
        except (KeyError, SourceError) as e:
            why = f"unreadable: {e}"
    if why is None and not isinstance(target, h5py.Dataset):
        why = "to a group: name its datasets with --datasets"
    if why is not None:
        skipped.setdefault(f"external link not followed ({why})", []).append(f"{full} -> {link.filename}:{link.path}")
        return None
    return target
