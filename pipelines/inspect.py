"""Summarize an output directory: features, shards, counts, sizes, compression, one decoded example.

    python -m pipelines.inspect OUTPUT_DIR [--tf_read] [--json]

``--tf_read`` also reads every shard back with plain tf.data + tf.io.parse_example and checks the
record counts against the metadata.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from pipelines import common
from transforms import metadata, reader
from transforms.errors import RecordError


def summarize(output_dir: str, tf_read: bool = False) -> dict:
    meta = metadata.load(output_dir)
    sample = next(reader.iter_numpy(output_dir), None)
    out = {
        "output_dir": output_dir,
        "num_records": meta["num_records"],
        "num_shards": len(meta["shards"]),
        "bytes": sum(s["bytes"] for s in meta["shards"]),
        "compression": meta["compression"],
        "features": [s.to_json() for s in meta["features"]],
        "shards": meta["shards"],
        "sample": {k: _short(v) for k, v in (sample or {}).items()},
    }
    if tf_read:
        out["tf_read_records"] = _count_with_tf(output_dir)
        if out["tf_read_records"] != meta["num_records"]:
            raise RecordError(f"tf.data read {out['tf_read_records']} examples, metadata says "
                              f"{meta['num_records']}", file=output_dir)
    return out


def _count_with_tf(output_dir: str) -> int:
    common.preload_tensorflow()
    ds = reader.to_tf_dataset(output_dir, batch_size=1024)
    return int(sum(int(next(iter(batch.values())).shape[0]) for batch in ds))


def _short(value: np.ndarray) -> str:
    text = np.array2string(np.asarray(value), threshold=8, edgeitems=2, max_line_width=100)
    return f"{value.dtype} {list(np.shape(value))} {text}"


def render(s: dict) -> str:
    lines = [f"{s['output_dir']}: {s['num_records']} examples in {s['num_shards']} shards, "
             f"{s['bytes']} bytes, compression {s['compression']}"]
    if "tf_read_records" in s:
        lines.append(f"read back with tf.data: {s['tf_read_records']} examples (matches the metadata)")
    lines.append(f"{'feature':<28} {'dtype':<10} {'shape':<18} encoding")
    for f in s["features"]:
        shape = "*" if f["shape"] is None else str(f["shape"])
        lines.append(f"{f['name']:<28} {str(f['dtype']):<10} {shape:<18} {f['encoding']}")
    lines.append("shards:")
    for sh in s["shards"][:10]:
        lines.append(f"  {sh['file']}: {sh['records']} records, {sh['bytes']} bytes")
    if len(s["shards"]) > 10:
        lines.append(f"  ... {len(s['shards']) - 10} more")
    lines.append("first example:")
    for k, v in s["sample"].items():
        lines.append(f"  {k}: {v}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.inspect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", help="an output directory of tfrecord-etl")
    parser.add_argument("--tf_read", action="store_true", help="also read every record with tf.data (default: off)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    parser.add_argument("--verbose", action="store_true", help="show TensorFlow logs (default: off)")
    args = parser.parse_args(argv)
    summary = summarize(args.output_dir, args.tf_read)
    print(json.dumps(summary, indent=1) if args.json else render(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run_main(main))
