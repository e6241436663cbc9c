"""Size and speed of the feature encodings (tensor, list, zlib, packbits) on real arrays.

    .venv/bin/python -m bench.encodings [--repeat 3]

The arrays come from a real photo (matplotlib's sample ``grace_hopper.jpg``, 600x512, as grayscale): 64 rows,
each the photo shifted by a different offset (``np.roll``), so no two rows are equal:

* ``mask``: a segmentation-style mask, the pixels brighter than the photo's median (bool [600, 512]);
* ``dense``: the photo itself (uint8 [600, 512]);
* ``sparse``: the photo's brightest 1% of pixels, the rest zero (float32 [600, 512]).

For each array and each encoding that can carry it: the bytes of the serialized Examples (no TFRecord framing),
encode throughput (``codec.encode_columns``, one batch of all rows) and decode throughput of the NumPy batch
decoder (``codec.decode_batch``) and of tf.data (``reader.decode_tf`` after ``tf.io.parse_example`` of a batch), in
MB/s of raw array bytes (10**6 bytes per second); the fastest of ``--repeat`` runs. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from tfrecord_etl.transforms import codec, reader
from tfrecord_etl.transforms.codec import FeatureSpec

ROWS = 64


def arrays() -> dict[str, np.ndarray]:
    from PIL import Image

    site = os.environ.get("TFRECORD_ETL_FIXTURES", os.path.join(os.path.dirname(__file__), "..", ".fixtures", "site"))
    photo = np.asarray(Image.open(os.path.join(site, "matplotlib/mpl-data/sample_data/grace_hopper.jpg")).convert("L"))
    rows = np.stack([np.roll(photo, (7 * i, 13 * i), axis=(0, 1)) for i in range(ROWS)])
    sparse = np.where(rows >= np.percentile(photo, 99), rows, 0).astype(np.float32)
    return {"mask": rows > np.median(photo), "dense": rows, "sparse": sparse}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(tf, name: str, arr: np.ndarray, encoding: str, repeat: int) -> dict | None:
    spec = FeatureSpec(name, codec.normalize_dtype(arr.dtype), arr.shape[1:], encoding)
    from tfrecord_etl.transforms.errors import EtlError

    try:
        records = codec.encode_batch({name: arr}, [spec], len(arr))
    except EtlError:  # this encoding cannot carry this array (e.g. packbits of a photo)
        return None
    mb = arr.nbytes / 1e6
    enc = best(lambda: codec.encode_columns({name: arr}, [spec], len(arr)).records(), repeat)
    dec = best(lambda: codec.decode_batch(records, [spec]), repeat)
    parse = reader.parse_spec(tf, [spec])
    batch = tf.constant(records)

    def tf_decode():
        parsed = tf.io.parse_example(batch, parse)
        out = tf.map_fn(
            lambda i: reader.decode_tf(tf, {k: v[i] for k, v in parsed.items()}, [spec])[name],
            tf.range(len(records)),
            fn_output_signature=tf.as_dtype(arr.dtype),
        )
        return out.numpy()

    got = tf_decode()
    assert np.array_equal(got, arr), (name, encoding)
    tfd = best(tf_decode, repeat)
    size = sum(len(r) for r in records)
    return {
        "array": name,
        "encoding": encoding,
        "raw_mb": mb,
        "bytes_mb": size / 1e6,
        "ratio": size / arr.nbytes,
        "encode_mbs": mb / enc,
        "decode_mbs": mb / dec,
        "tf_decode_mbs": mb / tfd,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    rows = []
    for name, arr in arrays().items():
        for encoding in codec.ENCODINGS:
            r = measure(tf, name, arr, encoding, args.repeat)
            if r:
                rows.append(r)
    print(
        "| array | encoding | raw MB | stored MB | stored / raw | encode MB/s | NumPy decode MB/s | tf.data decode MB/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['array']} | {r['encoding']} | {r['raw_mb']:.1f} | {r['bytes_mb']:.2f} | {r['ratio']:.3f} | "
            f"{r['encode_mbs']:.0f} | {r['decode_mbs']:.0f} | {r['tf_decode_mbs']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
