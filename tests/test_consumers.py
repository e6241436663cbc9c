"""Every consumer installed here on an output of each compression (tests/consumers_table.py), the docs'
consumers x compression table (docs/reading.md) generated from the same cells, and convert's one-line warning for zlib."""

from __future__ import annotations

import pytest

from tests import consumers_table
from tests.conftest import ROOT, convert


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return consumers_table.make_outputs(tmp_path_factory.mktemp("consumers"))


@pytest.mark.parametrize("compression", consumers_table.COMPRESSIONS)
@pytest.mark.parametrize("consumer", list(consumers_table.EXPECTED))
def test_consumer_reads_the_output_as_the_table_says(outputs, consumer, compression):
    assert consumers_table.run(consumer, outputs, compression) == consumers_table.EXPECTED[consumer][compression]


def test_the_docs_table_is_the_generated_one():
    assert consumers_table.markdown(consumers_table.EXPECTED) in (ROOT / "docs" / "reading.md").read_text(), (
        "docs/reading.md's consumers table differs: paste the output of python -m tests.consumers_table"
    )


def test_convert_warns_once_that_zlib_shards_are_not_read_everywhere(tmp_path, capsys):
    import numpy as np

    np.savez(tmp_path / "in.npz", x=np.arange(10, dtype=np.float32))
    code, out, err = convert(tmp_path / "in.npz", tmp_path / "z", "--compression", "zlib", capsys=capsys)
    assert code == 0
    lines = [line for line in (out + err).splitlines() if "zlib" in line and "warning" in line]
    assert lines == [line for line in err.splitlines() if line.startswith("warning: ")] and len(lines) == 1
    for reader in ("TensorFlow", "Beam", "TFXIO", "Ray", "`tfrecord` package", "--compression gzip"):
        assert reader in lines[0], reader
    for compression in ("gzip", "none"):
        code, out, err = convert(
            tmp_path / "in.npz", tmp_path / compression, "--compression", compression, capsys=capsys
        )
        assert code == 0 and "warning" not in out + err
