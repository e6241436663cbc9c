"""Contender "raw copy": the limit. The same bytes, read and written with no encoding at all, in one process.

    python -m bench.raw_copy --input data.h5 --output out/raw.bin [--chunk_rows N]
    python -m bench.raw_copy --records 'in/*.tfrecord' --output out/raw.bin

With ``--input``, reads every dataset of the HDF5 file a chunk of rows at a time (about 16 MB), exactly
as the seed loop does, and writes each chunk's array bytes to one file: the floor cost of moving the
raw array bytes from the source to disk (the "x raw" ratios). With ``--records`` (augmentation), copies
the bytes of the given TFRecord files, 16 MB at a time, into one file: the floor cost of rewriting a
record collection.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from bench.common import CHUNK_BYTES, iter_h5_chunks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.raw_copy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="HDF5 file")
    src.add_argument("--records", help="glob of TFRecord files")
    ap.add_argument("--output", required=True, help="file to write")
    ap.add_argument("--chunk_rows", type=int, default=None, help="rows read at a time (default: about 16 MB)")
    args = ap.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    started = time.perf_counter()
    nbytes = 0
    with open(args.output, "wb") as out:
        if args.input:
            for columns in iter_h5_chunks(args.input, args.chunk_rows):
                for col in columns.values():
                    out.write(memoryview(col).cast("B") if col.flags.c_contiguous else col.tobytes())
                    nbytes += col.nbytes
        else:
            buf = bytearray(CHUNK_BYTES)
            for path in sorted(glob.glob(args.records)):
                with open(path, "rb", buffering=0) as f:
                    while True:
                        k = f.readinto(buf)
                        if not k:
                            break
                        out.write(memoryview(buf)[:k])
                        nbytes += k
    seconds = time.perf_counter() - started
    print(
        f"raw_copy: {nbytes:,} bytes in {seconds:.3f} s ({nbytes / 1e6 / max(seconds, 1e-9):,.0f} MB/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
