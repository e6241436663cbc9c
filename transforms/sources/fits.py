"""FITS source (``--format fits``): the images and tables of a FITS file through ``astropy.io.fits``, memory-mapped,
each data HDU a row group of its own.

An image HDU is one array with its rows along NumPy's first axis (FITS's last axis, ``NAXISn``: astropy's order,
``hdul[i].data[row]``); a table HDU (binary or ASCII) is one array per column, sharing the table's rows. The
default is the largest data HDU in bytes (:func:`container.choose_group`), ``--row_group N`` names another and
``--datasets`` names HDUs (by label) and columns (``LABEL/COLUMN``) directly; ``--fits_cards`` carries header
cards into every Example. The values are the stored ones, exact (:mod:`fitshdus`: the unsigned-integer convention
applied, other scaling recorded, not applied). Tile-compressed images (``CompImageHDU``) are decompressed by astropy,
a range's tiles only, after a check of their declared size against their compressed bytes.
Reference: FITS Standard 4.0; ``astropy.io.fits``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import conventions, fitshdus
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    check_empty_rows,
    check_names,
    leaf_specs,
    log,
    refuse_special_file,
    row_bytes,
    row_spec,
)
from tfrecord_etl.transforms.sources.container import (
    ContainerSource,
    check_leading_lengths,
    choose_group,
    datasets_index,
    log_skipped,
)
from tfrecord_etl.transforms.sources.signatures import other_format_hint
from tfrecord_etl.transforms.storage import fileio

FITS_MAGIC = (b"SIMPLE  =",)  # FITS Standard 4.0, section 4.4.1.1: the primary header's first card
CARD_PREFIX = "header/"  # --fits_cards KEY becomes the feature header/KEY


class FitsSource(ContainerSource):
    """FITS files (local files only: read memory-mapped; copy a remote one first).

    Rows mode: the items of ``options.datasets`` (HDU labels and ``LABEL/COLUMN`` names, :mod:`fitshdus`), else
    the HDU of row group ``options.row_group``, by default the largest data HDU; features are the image HDU's
    label or the columns' names, plus ``header/KEY`` for each ``--fits_cards`` card. Datasets mode: each image
    and column is one Example (``key``, ``array``).
    """

    options_models = ("options_container.ContainerOptions", "fits_options.FitsOptions")

    format_name = "fits"
    help_label = "FITS images and tables"
    suffixes = (".fits", ".fit", ".fts", ".fits.fz")
    magic = FITS_MAGIC
    content_label = "a FITS file"

    def open_file(self, path: str, compressed_as_tables: bool = False):
        """``astropy.io.fits.HDUList`` of ``path``, every header read, memory-mapped, scaling not applied.

        Raises:
          SourceError: a remote, special or unreadable file (naming it).
        """
        from astropy.io import fits  # deferred: astropy, this format's own dependency

        refuse_special_file(path)
        if not fileio.is_local(path):
            raise SourceError(
                "FITS files are read memory-mapped from local disk",
                file=path,
                hint="copy the file to a local directory first",
            )
        try:
            with warnings.catch_warnings():  # (astropy's "may have been truncated": check_sizes says it in one line)
                warnings.simplefilter("ignore")
                hdul = fits.open(
                    path,
                    memmap=True,
                    do_not_scale_image_data=True,
                    uint=False,
                    disable_image_compression=compressed_as_tables,
                )
                if not compressed_as_tables:  # (the size checks read the headers one by one)
                    hdul.readall()
            return hdul
        except Exception as e:  # noqa: BLE001 - astropy raises OSError/ValueError/KeyError on damaged headers
            raise SourceError(
                f"Not a readable FITS file: {e}",
                file=path,
                hint=other_format_hint(path, self.format_name) or "check that the file is complete",
            ) from None

    def layout(self, path: str, check: bool = True):
        """``(HDUList, {name: Item}, skipped)`` of ``path`` (:mod:`fitshdus`), after the size checks (``check``).

        Raises:
          SourceError: a declared size beyond the file or a compression bomb (:func:`fitshdus.check_sizes`).
        """
        if check:
            from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions  # deferred: pydantic

            raw = self.open_file(path, compressed_as_tables=True)
            try:
                ratio = self.options.of(NumpyOptions).max_compression_ratio
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fitshdus.check_sizes(raw, os.path.getsize(path), path, ratio, self.options.max_datasets)
            finally:
                raw.close()
        from astropy.io import fits  # deferred: astropy

        f = self.open_file(path)
        items, skipped = {}, {"variable-length array": [], "random groups": []}
        try:
            for i, (label, hdu) in enumerate(zip(fitshdus.labels(f), f)):
                if isinstance(hdu, fits.GroupsHDU):
                    skipped["random groups"].append(label)
                elif isinstance(hdu, (fits.BinTableHDU, fits.TableHDU)):
                    found, vla = fitshdus.column_items(hdu, i, label)
                    items.update((it.name, it) for it in found)
                    skipped["variable-length array"] += vla
                else:
                    item = fitshdus.image_item(hdu, i, label)
                    if item is not None:
                        items[item.name] = item
        except SourceError:
            f.close()
            raise
        except Exception as e:  # noqa: BLE001 - astropy on a damaged table or image header
            f.close()
            raise SourceError(
                f"Not a readable FITS file: {e}", file=path, hint="check that the file is complete"
            ) from None
        return f, items, skipped

    def _item(self, items: dict, name: str, path: str) -> fitshdus.Item:
        if name not in items:
            listing = ", ".join(list(items)[:10]) + (" ..." if len(items) > 10 else "")
            raise SourceError(
                "No such HDU or column",
                file=path,
                dataset=name,
                hint=f"items: {listing}; tfrecord-etl inspect FILE lists them",
            )
        return items[name]

    def index(self, path: str) -> FileIndex:
        """Learns rows and features (see the class): headers, and one row of each table column.

        Raises:
          SourceError: unreadable, truncated or remote file, a compression bomb, unknown HDU or column.
          SchemaError: lengths that differ, no data HDU, a ``--fits_cards`` card missing.
        """
        f, items, skipped = self.layout(path)
        try:
            log_skipped(skipped, path, "datasets mode" if self.loose else "rows mode")
            if not items and skipped["random groups"]:
                raise SchemaError(
                    f"The file holds random groups only (HDU {', '.join(skipped['random groups'])}): a form "
                    "tfrecord-etl does not read",
                    file=path,
                    hint="with astropy: np.savez('x.npz', data=hdul[0].data.data, **{p: hdul[0].data.par(p) for p in "
                    "hdul[0].data.parnames}), then convert the .npz",
                )
            if not self.loose:
                names = list(self.options.datasets or self._default(items, path) or [])
                if names or not self.switch_to_datasets(path):
                    return self._index_rows(f, items, names, path)
            if self.card_names():
                raise SchemaError(
                    "--fits_cards adds features to the rows of one HDU: not in datasets mode",
                    file=path,
                    hint="leave out --fits_cards, or convert the HDU's rows (--container_mode rows)",
                )
            names = list(self.options.datasets or items)
            chosen = [self._item(items, n, path) for n in names]
            specs = [row_spec(ARRAY, it.dtype, it.shape, f"{path}, {it.name}") for it in chosen]
            return datasets_index(path, names, specs, [it.nbytes for it in chosen], "image or column")
        finally:
            f.close()

    def _default(self, items: dict, path: str) -> list[str]:
        entries = [(it.name, it.shape[0], f"HDU {it.label}", it.nbytes) for it in items.values()]
        if not entries:  # (no switch to datasets mode: there is nothing to convert either way)
            raise SchemaError(
                "The file holds no image or table with data",
                file=path,
                hint="tfrecord-etl inspect FILE lists its HDUs",
            )
        return choose_group(entries, self.options.row_group or None, path)

    def _index_rows(self, f, items: dict, names: list[str], path: str) -> FileIndex:
        self._rows_indexed = True
        chosen = [self._item(items, n, path) for n in names]
        specs, lengths = [], {}
        for it in chosen:
            specs += leaf_specs(it.feature, it.dtype, it.shape[1:], f"{path}, {it.name}")
            lengths[it.name] = it.shape[0]
        data_bytes = row_bytes(specs)
        for card, value in self.cards(f, chosen[0].hdu, path).items():
            specs.append(card_spec(card, value, path))
        check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "HDUs and columns")
        check_empty_rows(rows, data_bytes, self.options, path)
        kept = {it.name: it.scaling for it in chosen if it.scaling}
        scaled = {n: s for n, s in kept.items() if set(s) - {"BLANK", "TNULL"}}
        if scaled:
            log.warning(
                "'%s': scaling not applied, the stored values are written (recorded in metadata.json): %s",
                path,
                "; ".join(f"{n} {s}" for n, s in scaled.items()),
            )
        chunk = max(it.tile_rows for it in chosen)
        return FileIndex(path, rows, tuple(specs), row_bytes(specs), chunk, tuple(names), attributes=kept or None)

    def card_names(self) -> list[str]:
        """The keywords of ``--fits_cards`` (upper case), or []."""
        from tfrecord_etl.transforms.sources.fits_options import FitsOptions  # deferred: pydantic

        return self.options.of(FitsOptions).fits_cards or []

    def cards(self, f, hdu: int, path: str) -> dict:
        """``{KEY: value}`` of the ``--fits_cards`` cards: HDU ``hdu``'s header, else the primary header's.

        Raises:
          SchemaError: a card in neither header, or one without a value (naming the file, the HDU and the card).
        """
        out = {}
        for card in self.card_names():
            header = next((h.header for h in (f[hdu], f[0]) if card in h.header), None)
            value = None if header is None else header[card]
            if not isinstance(value, (bool, int, float, complex, str)):
                raise SchemaError(
                    f"Header card '{card}' {'has no value' if header is not None else 'not found'} in HDU "
                    f"'{fitshdus.labels(f)[hdu]}' or the primary header",
                    file=path,
                    hint="name cards every file has in --fits_cards (tfrecord-etl inspect FILE lists each HDU)",
                )
            out[card] = value
        return out

    def open_for_read(self, path: str):
        f, items, _ = self.layout(path, check=False)  # (checked when indexed)
        return f, items

    def close_handle(self, handle) -> None:
        handle[0].close()

    def read(self, rr: RowRange) -> Columns:
        try:
            f, items = self.opened(rr.path)
            chosen = [self._item(items, n, rr.path) for n in rr.items]
            if self.loose:
                return {KEY: [n.encode() for n in rr.items], ARRAY: [self.rows(f, it, 0, it.shape[0]) for it in chosen]}
            out = {it.feature: self.rows(f, it, rr.start, rr.stop) for it in chosen}
            for card, value in self.cards(f, chosen[0].hdu, rr.path).items():
                out[CARD_PREFIX + card] = card_column(value, rr.num_rows)
            return out
        except (SourceError, SchemaError):
            raise
        except Exception as e:  # noqa: BLE001
            self.close()
            raise SourceError(f"Cannot read {rr.describe()}: {e}", file=rr.path) from None

    @staticmethod
    def rows(f, item: fitshdus.Item, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``item`` as written (:mod:`fitshdus`): a section of an image (the tiles of those
        rows only, when compressed), the rows of a column."""
        hdu = f[item.hdu]
        if item.column is None:
            return fitshdus.as_written(np.array(hdu.section[start:stop]), item.dtype)
        return fitshdus.column_rows(hdu, hdu.columns[item.column], start, stop)[0]

    def tree(self, path: str) -> dict:
        """Inspect's tree of ``path`` (``hdf5tree.render_tree``'s form): each HDU and column with the dtype and
        shape convert writes, what convert skips and why, the row groups (one per data HDU) and the default."""
        f, items, skipped = self.layout(path)
        try:
            hdus = [
                (i, label, type(hdu).__name__, getattr(hdu, "compression_type", None))
                for i, (label, hdu) in enumerate(zip(fitshdus.labels(f), f))
            ]
        finally:
            f.close()
        none = {"dtype": "-", "shape": [], "chunks": None, "filters": [], "storage": "-"}
        objects: list[dict] = []
        for i, label, kind, compressed in hdus:
            own = [it for it in items.values() if it.hdu == i]
            skips = [
                (why, n) for why, names in skipped.items() for n in names if n == label or n.startswith(label + "/")
            ]
            if not own and not skips:
                objects.append({"path": label, **none, "kind": "HDU without data", "filters": [f"HDU {i} {kind}"]})
            elif (own and own[0].column is not None) or (skips and skips[0][1] != label):
                objects.append({"path": label, "kind": "group"})  # a table: its columns below
            objects += [{"path": n, **none, "kind": why} for why, n in skips]
            for it in own:
                objects.append(
                    {
                        "path": it.name,
                        "kind": "dataset",
                        "dtype": f"S{it.dtype.itemsize}" if it.dtype.kind == "S" else it.dtype.newbyteorder("=").name,
                        "shape": list(it.shape),
                        "chunks": [it.tile_rows] if compressed else None,
                        "filters": [f"HDU {i} {kind}"]
                        + ([f"{compressed} tiles"] if compressed else [])
                        + [f"{k} {v} (not applied: metadata.json)" for k, v in it.scaling.items()],
                        "storage": "table column" if it.column else "image",
                    }
                )
        entries = [(it.name, it.shape[0], f"HDU {it.label}", it.nbytes) for it in items.values()]
        groups, default = conventions.tree_groups(entries, None)
        return {
            "file": path,
            "format": "FITS",
            "objects": objects,
            "truncated": False,
            "row_groups": groups,
            "default": default,
        }


def card_spec(card: str, value, path: str) -> FeatureSpec:
    """The feature ``header/CARD`` of a card's value: bytes (text), bool, int64, float64 or complex128."""
    if isinstance(value, str):
        return FeatureSpec(CARD_PREFIX + card, VLEN_BYTES, (), "list")
    return row_spec(CARD_PREFIX + card, np.asarray(card_column(value, 1)).dtype, (), f"{path}, header card '{card}'")


def card_column(value, rows: int):
    """A card's value repeated for ``rows`` rows: a list of bytes for text, else an array."""
    if isinstance(value, str):
        return [value.encode()] * rows
    dtype = (
        np.bool_
        if isinstance(value, bool)
        else np.int64
        if isinstance(value, int)
        else np.float64
        if isinstance(value, float)
        else np.complex128
    )
    return np.full(rows, value, dtype=dtype)
