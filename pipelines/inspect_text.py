"""The text ``tfrecord-etl inspect`` prints: the human summary of an output, of files of records and of a collection,
from the dicts :mod:`inspect` builds (``--json`` prints those instead); every line has its non-printable
characters escaped.
"""

from __future__ import annotations

import json

import numpy as np

from tfrecord_etl.transforms.errors import printable


def render_collection(s: dict) -> str:
    """The human summary of a collection (:func:`summarize_collection`)."""
    pattern = f", input {s['input_pattern']}" if s.get("input_pattern") else ""
    lines = [
        f"{s['collection_dir']}: collection of {s['num_spans']} spans{pattern}; "
        f"{len(s['spans'])} selected, {s['num_records']} records",
        f"{'span':>8} {'version':>8} {'versions':<10} {'date':<11} {'records':>10} {'schema':<13} committed",
    ]
    for e in s["spans"]:
        shown = ",".join("-" if v is None else str(v) for v in e["versions"])
        lines.append(
            f"{e['span']:>8} {'-' if e['version'] is None else e['version']:>8} {shown:<10} "
            f"{e['date'] or '-':<11} {e['num_records']:>10} {e['schema']:<13} {e['committed']}"
        )
    if "tf_read_records" in s:
        lines.append(f"read back with tf.data: {s['tf_read_records']} records (matches collection.json)")
    for c in s["schema_changes"]:
        lines.append(
            f"schema change at span {c['span']}: {c['previous'][:12]} -> {c['schema'][:12]} (previous span "
            f"{c.get('previous_span', '?')})"
        )
    for rel in s["uncommitted"]:
        lines.append(f"uncommitted: {rel} (not listed in collection.json: readers do not read it)")
    text = "\n".join(printable(line) for line in lines)
    return text + "\n\n" + render(s["span"]) if "span" in s else text


def short(value: np.ndarray) -> str:
    text = np.array2string(np.asarray(value), threshold=8, edgeitems=2, max_line_width=100)
    text = " ".join(line.strip() for line in text.splitlines())  # one line: the summary escapes newlines
    return f"{value.dtype} {list(np.shape(value))} {text}"


def render(s: dict) -> str:
    """The human summary; every line has its non-printable characters escaped (``errors.printable``)."""
    lines = [
        f"{s['output_dir']}: {s['num_records']} examples in {s['num_shards']} shards, "
        f"{s['bytes']} bytes, compression {s['compression']}"
    ]
    if "inferred" in s:
        lines.append(
            f"no metadata.json: features learned from all {s['inferred']['from_records']} records "
            "(a tfrecord-etl output directory without it is incomplete)"
        )
    if "tf_read_records" in s:
        lines.append(
            f"read back with tf.data: {s['tf_read_records']} examples (matches the "
            f"{'count' if 'inferred' in s else 'metadata'})"
        )
    if s.get("splits"):
        lines.append(
            "splits: "
            + ", ".join(
                f"{name} {info['num_records']} records in {info['num_shards']} shards"
                for name, info in s["splits"].items()
            )
        )
    if s.get("tfds"):
        lines.append(
            f"TFDS dataset {s['tfds']['name']} {s['tfds'].get('version', '')}: tfds.builder_from_directory loads it"
        )
    lines.append(f"{'feature':<28} {'dtype':<10} {'shape':<18} encoding")
    for f in s["features"]:
        shape = "*" if f["shape"] is None else str(f["shape"])
        lines.append(f"{printable(f['name']):<28} {f['dtype']!s:<10} {shape:<18} {f['encoding']}{_categorical(f)}")
    lines.append("shards:")
    for sh in s["shards"][:10]:
        lines.append(f"  {sh['file']}: {sh['records']} records, {sh['bytes']} bytes")
    if len(s["shards"]) > 10:
        lines.append(f"  ... {len(s['shards']) - 10} more")
    lines.append("first example:")
    for k, v in s["sample"].items():
        lines.append(f"  {k}: {v}")
    return "\n".join(printable(line) for line in lines)


def render_input(s: dict) -> str:
    """The human summary of an input file convert reads (:func:`inspect.summarize_input`)."""
    lines = [
        f"{s['input']}: an input of convert, format {s['format']} ({s['label']}): convert makes {s['examples']} "
        f"Examples, one per {s['per']}" + (f", {s['bytes_per_row']} bytes per row" if s["per"] == "row" else ""),
        f"{'feature':<28} {'dtype':<10} shape",
    ]
    for f in s["features"]:
        shape = "*" if f["shape"] is None else str(f["shape"])
        lines.append(f"{printable(f['name']):<28} {f['dtype']!s:<10} {shape}{_categorical(f)}")
    for group, values in (s.get("attributes") or {}).items():  # what metadata.json records of the file
        lines.append(f"{group}: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in values.items()))
    return "\n".join(printable(line) for line in lines)


def _categorical(feature: dict) -> str:
    """``", categorical: 11 names, written as strings"`` for a categorical feature's entry, else ``""``."""
    cats = feature.get("categories")
    if not cats:
        return ""
    return f", categorical: {len(cats['values'])} names from {cats['origin']}, written as {cats['written']}"
