"""Which row group of a container (HDF5, netCDF-4, NetCDF-3) rows mode converts by default, by the container's own
conventions before size: the rules, in order (``docs/converting/hdf5.md``, "Which row group convert takes").

1. **CF data variables** (the CF Conventions, section 1.3 and chapters 5, 7: "Coordinate Types", "Cell bounds",
   "Ancillary data", "Grid mappings", "Cell measures"): a variable named by another's ``coordinates``, ``bounds``,
   ``climatology``, ``ancillary_variables``, ``grid_mapping``, ``cell_measures`` or ``formula_terms`` attribute, and a
   dimension coordinate (a netCDF-4 dimension scale, a NetCDF-3 variable named as its only dimension), describes the
   data: it is never the default group on its own; it joins the data variables' group as a context feature when it
   shares their row axis (its first dimension).
2. **The record axis**: a group whose row axis is the unlimited dimension (netCDF-4: a dimension scale created
   resizable, ``maxshape`` None; NetCDF-3: the record dimension) comes before the other groups of data variables.
3. **Dimension scales decide** which datasets share a row axis (``DIMENSION_LIST``, the netCDF-4 data model): in a
   file that attaches dimension scales, a dataset without one never joins a group on a scale by equal length.
4. **Top-level groups** (e.g. ``/Scan 1`` and ``/Scan 2``): datasets under different top-level groups share a row
   axis only through a shared dimension scale, never by equal length; when the best groups lie under different
   top-level groups, the run refuses with one line listing them and the flag for each instead of choosing.
5. **Metadata groups**: datasets under a group named ``Header`` or ``Metadata`` (h5ebsd's ``/Scan 1/EBSD/Header``)
   describe the data; they are the default only when nothing else has rows.

Then, among the groups of the best rank, the largest in bytes, as before. AnnData, Loom, MINC-2, MATLAB v7.3 and
Keras files keep their own rules (``hdf5layout``): their layouts are conventions already; NWB files
theirs (``hdf5nwb``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfrecord_etl.transforms.sources import hdf5layout as layout

# attributes naming the variables that describe a data variable (CF 1.11, Appendix A); in the forms
# "a b c" (names) or "key: a b key2: c" (cell_measures, formula_terms, grid_mapping's extended form)
CF_REFERENCES = (
    "coordinates",
    "bounds",
    "climatology",
    "ancillary_variables",
    "grid_mapping",
    "cell_measures",
    "formula_terms",
)
METADATA_GROUPS = ("header", "headers", "metadata")
RECORD, DATA, DESCRIPTIVE = 0, 1, 2  # the ranks of a group: lower is taken first
RANK_WHY = {
    RECORD: "data variables on the unlimited (record) dimension",
    DATA: "data variables",
    DESCRIPTIVE: "coordinates, bounds or metadata only",
}


@dataclasses.dataclass
class Roles:
    """What a container's conventions say of its datasets (paths as in the row-group entries).

    ``descriptive``: path -> why it describes data (``bounds of /nav_lat``, ``dimension coordinate``, ``under a
    Header group``); ``unlimited``: the dimensions (scale paths or NetCDF-3 names) that are unlimited;
    ``split_top``: the datasets lie under two or more top-level groups (rule 4 applies); ``scales``: the file
    attaches dimension scales (rule 3 applies).
    """

    descriptive: dict = dataclasses.field(default_factory=dict)
    unlimited: set = dataclasses.field(default_factory=set)
    split_top: bool = False
    scales: bool = False


def _names(value, keys: bool = False) -> list[str]:
    """The variable names of a CF reference attribute (bytes, str or a 1-element array): ``key:`` words dropped,
    or (``keys``: grid_mapping's extended form ``crs: lat lon``, whose keys are variables) kept without the
    colon."""
    if isinstance(value, np.ndarray):
        value = value.ravel()[0] if value.size == 1 else b""
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        return []
    return [w.rstrip(":") if keys else w for w in value.split() if keys or not w.endswith(":")]


def _resolve(name: str, owner: str, known) -> str | None:
    """The path of variable ``name`` referenced by the variable at ``owner``: absolute, or searched from the
    owner's group up to the root (CF 1.8, "Search by proximity"); None when no such dataset exists."""
    if name.startswith("/"):
        return name if name in known else None
    group = owner.rsplit("/", 1)[0]
    while True:
        candidate = f"{group}/{name}"
        if candidate in known:
            return candidate
        if not group:
            return None
        group = group.rsplit("/", 1)[0]


def top_level(path: str) -> str:
    """The top-level group of ``path`` (``/Scan 1`` of ``/Scan 1/EBSD/Data/x``), ``/`` for a root dataset."""
    parts = path.strip("/").split("/")
    return "/" + parts[0] if len(parts) > 1 else "/"


def _under_metadata_group(path: str) -> bool:
    return any(p.lower() in METADATA_GROUPS for p in path.strip("/").split("/")[:-1])


def own_rules(f) -> bool:
    """True for an HDF5 file whose layout is a convention of its own, kept as it was: AnnData (``encoding-type``
    ``anndata`` at the root, or ``/X``, ``/obs`` and ``/var`` as older AnnData writes), Loom (``row_attrs`` and ``col_attrs``), MINC-2 (``/minc-2.0``), Keras weights."""
    enc = f.attrs.get("encoding-type")
    if isinstance(enc, (bytes, str)) and (enc.decode() if isinstance(enc, bytes) else enc) == "anndata":
        return True
    return (
        all(k in f for k in ("X", "obs", "var"))
        or ("row_attrs" in f and "col_attrs" in f)
        or "minc-2.0" in f
        or layout.is_keras(f)
    )


class Hdf5Roles:
    """Collects :class:`Roles` of an open HDF5 file while its datasets are walked: ``observe`` every dataset
    (any kind), then ``roles(paths)`` with the paths of the row-group entries. Metadata only."""

    def __init__(self, f):
        self.own = own_rules(f)
        self.refs: list[tuple[str, str, str]] = []  # (owner, attribute, name)
        self.descriptive: dict = {}
        self.unlimited: set = set()
        self.scales = False
        self.matlab = False

    def observe(self, path: str, dset, kind: str) -> None:
        if self.own:
            return
        attrs = dset.attrs
        if kind in (layout.SCALE, layout.DIMENSION):
            try:
                if dset.maxshape and dset.maxshape[0] is None:
                    self.unlimited.add(dset.name)
            except Exception:  # noqa: BLE001 - a damaged scale: not unlimited
                pass
            if kind == layout.SCALE:
                self.descriptive[path] = "dimension coordinate"
            return
        try:
            names = set(attrs.keys())  # one iteration of the attributes, not one look-up per name
        except Exception:  # noqa: BLE001 - attributes h5py cannot list: none known
            return
        if "MATLAB_class" in names:
            self.matlab = True
            return
        if "DIMENSION_LIST" in names:
            self.scales = True
        for key in names.intersection(CF_REFERENCES):
            try:
                value = attrs[key]
            except Exception:  # noqa: BLE001 - an attribute h5py cannot read: no reference
                continue
            self.refs += [(path, key, n) for n in _names(value, keys=key == "grid_mapping")]

    def roles(self, paths) -> Roles | None:
        """The roles of the entries ``paths``, or None when the file keeps its own rules (AnnData, Loom, MINC-2,
        MATLAB v7.3, Keras)."""
        if self.own or self.matlab:
            return None
        known = set(paths) | set(self.descriptive)
        descriptive = dict(self.descriptive)
        for owner, key, name in self.refs:
            target = _resolve(name, owner, known)
            if target is not None and target != owner:
                descriptive.setdefault(target, f"{key} of {owner}")
        for p in paths:
            if p not in descriptive and _under_metadata_group(p):
                descriptive[p] = (
                    "under a "
                    + next(x for x in p.strip("/").split("/")[:-1] if x.lower() in METADATA_GROUPS)
                    + " group"
                )
        tops = {top_level(p) for p in paths} - {"/"}
        return Roles(descriptive, self.unlimited, len(tops) > 1, self.scales)


def netcdf3_roles(f) -> Roles:
    """:class:`Roles` of an open SciPy ``netcdf_file``: CF references, dimension coordinates and the record
    dimension (the one of size None)."""
    descriptive = {}
    names = set(f.variables)
    for name, var in f.variables.items():
        if tuple(var.dimensions) == (name,):
            descriptive.setdefault(name, "dimension coordinate")
        attrs = getattr(var, "_attributes", {})
        for key in CF_REFERENCES:
            for ref in _names(attrs.get(key), keys=key == "grid_mapping"):
                if ref in names and ref != name:
                    descriptive.setdefault(ref, f"{key} of {name}")
    unlimited = {d for d, size in f.dimensions.items() if size is None}
    return Roles(descriptive, unlimited, False, False)


def ranked_groups(entries, roles: Roles | None) -> list[layout.RowGroup]:
    """The row groups of ``entries`` (:func:`hdf5layout.group_rows`'s form) in the order convert numbers them:
    by rank (:data:`RECORD`, :data:`DATA`, :data:`DESCRIPTIVE`), then bytes; ``roles`` None: by bytes alone."""
    if roles is None:
        return layout.group_rows(entries)
    context = (lambda p: top_level(p)) if roles.split_top else None
    groups = layout.group_rows(entries, context=context, join_unnamed=not roles.scales)
    ranked = []
    for g in groups:
        if all(p in roles.descriptive for p in g.datasets):
            rank = DESCRIPTIVE
        elif g.dimension is not None and g.dimension in roles.unlimited:
            rank = RECORD
        else:
            rank = DATA
        ranked.append(dataclasses.replace(g, rank=rank))
    return sorted(ranked, key=lambda g: (g.rank, -g.nbytes, -len(g.datasets), -g.rows, g.datasets))


def default_choice(groups: list[layout.RowGroup], roles: Roles | None) -> tuple[int | None, str]:
    """``(number, why)`` of the group convert takes without ``--row_group`` / ``--datasets`` (1-based), or
    ``(None, why)`` when it refuses to choose: the best-ranked groups lie under different top-level groups."""
    if not groups:
        return None, "no dataset with rows"
    best = [g for g in groups if g.rank == groups[0].rank]
    if roles is None:
        return 1, "the largest in bytes" if len(groups) > 1 else "the only row group"
    tops = {g.context for g in best}
    if len(best) > 1 and (len(tops) > 1 or (None in tops and roles.split_top)):
        names = sorted(t or "several top-level groups" for t in tops)
        return None, (
            f"the {RANK_WHY[groups[0].rank]} lie under {len(tops)} top-level groups that share no "
            f"dimension scale ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
        )
    why = RANK_WHY[groups[0].rank] + (", the largest in bytes" if len(best) > 1 else "")
    if len(groups) == 1:
        return 1, "the only row group"
    rest = sorted({g.rank for g in groups} - {groups[0].rank})
    if groups[0].rank == DESCRIPTIVE:
        return 1, f"nothing else has rows: {why}"
    other = {DATA: "data variables on other dimensions", DESCRIPTIVE: RANK_WHY[DESCRIPTIVE]}
    return 1, why + (f"; the others hold {', or '.join(other[r] for r in rest)}" if rest else "")


def tree_groups(entries, roles: Roles | None) -> tuple[list[dict], dict]:
    """Inspect's row groups (``group``, ``rows``, ``dimension``, ``datasets``, ``bytes``, ``flag``, ``top``,
    ``role``) and ``{"group": number or None, "why": ...}``: the one convert takes by default, and why."""
    groups = ranked_groups(entries, roles)
    number, why = default_choice(groups, roles)
    said = roles is not None and any(g.rank != DATA for g in groups)  # (a plain file's groups are all data)
    rows = [
        {
            "group": i,
            "rows": g.rows,
            "dimension": g.dimension,
            "datasets": list(g.datasets),
            "bytes": g.nbytes,
            "flag": "--datasets " + ",".join(g.datasets),
            "top": g.context,
            "role": RANK_WHY[g.rank] if said else None,
        }
        for i, g in enumerate(groups, 1)
    ]
    return rows, {"group": number, "why": why}


def describe_role(roles: Roles | None, path: str) -> str | None:
    """Why ``path`` describes data (inspect's annotation of a dataset), or None."""
    return None if roles is None else roles.descriptive.get(path)
