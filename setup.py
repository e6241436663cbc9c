"""tfrecord-etl: NumPy arrays (HDF5, .npz, .npy) -> sharded TFRecord files of tf.train.Example on Apache Beam.

Installs one import package, ``tfrecord_etl``, holding the repo's ``transforms/`` and ``pipelines/`` folders as
``tfrecord_etl.transforms`` and ``tfrecord_etl.pipelines`` (other PyPI distributions install top-level
``transforms`` and ``pipelines`` packages: ours never shadow theirs), and the console command ``tfrecord-etl``.
``pip install .`` installs the reader (NumPy and google-crc32c: reader.iter_numpy, RandomAccess, get,
verify, inspect); ``pip install '.[beam]'`` adds the pipelines (Beam, TensorFlow, tfx-bsl, h5py, ...).
Also usable as Beam's ``--setup_file``: the sdist Beam builds from it for the workers, from the project's launcher,
installs the pipelines without any extra (WORKER_ENV below).
"""

import os

import setuptools
from setuptools.command.sdist import sdist as _sdist

_FOLDERS = ("transforms", "pipelines")  # the repo's top-level folders, installed under tfrecord_etl
# the documentation site (mkdocs.yml): mkdocs build --strict, or mkdocs serve to preview it; mkdocstrings formats
# the API page's signatures with ruff
_DOCS = [
    "mkdocs>=1.6.1,<2",
    "mkdocs-material>=9.8.2,<10",
    "mkdocstrings-python>=2.0.11,<3",
    # pinned: configs/lint.sh checks the format, which changes between ruff releases
    "ruff==0.17.6",
]

# Reading an output (tfrecord_etl.transforms.reader, verify, inspect): `pip install .`
READER = ["numpy>=1.26", "google-crc32c>=1.5"]
# The pipelines (convert, augment, the Beam transforms): `pip install '.[beam]'` (or the wheel's
# path with [beam])
PIPELINES = [
    # tfx-bsl 1.21 pins tensorflow 2.21 and apache-beam[gcp]; these ranges resolve together on Python 3.11.
    "apache-beam[gcp]>=2.77,<2.78",
    "tensorflow>=2.21,<2.22",
    "tfx-bsl>=1.21,<1.22",
    "tensorflow-metadata>=1.17",
    "h5py>=3.10",
    "pydantic>=2.5",
    "PyYAML>=6.0",
    "tqdm>=4.66",
    # NetCDF-3 classic / 64-bit offset files (scipy.io.netcdf_file, memory-mapped); netCDF-4 goes through h5py
    "scipy>=1.11",
    # HDF5 filter plugins (Blosc, Blosc2, BZip2, LZ4, Zstd, Bitshuffle, SZ, ZFP, ...), registered before any HDF5
    # file is opened: a 46.4 MB wheel (7.1.0, manylinux x86_64), 185 MB installed, next to TensorFlow's 1.9 GB
    "hdf5plugin>=4.1",
    # gzip/zlib shards and the zlib encoding through ISA-L (several times zlib's speed both ways; wheels for
    # Linux, macOS and Windows), zlib-ng where ISA-L has no wheel; CPython's zlib is the last fallback (and the
    # reader's, which takes them too when installed)
    "isal>=1.7,<2",
    "zlib-ng>=0.5,<2",
]
# Dataflow workers install the sdist Beam builds from this file (--setup_file) without extras. The launcher
# (pipelines/common.py: run_main) sets this variable, so that sdist carries WORKER_FILE, and an install from it
# has the pipelines' requirements as base requirements. Other sdists and every wheel: the reader's only.
WORKER_ENV = "TFRECORD_ETL_WORKER_SDIST"
WORKER_FILE = "PIPELINE-REQUIREMENTS.txt"
_HERE = os.path.dirname(os.path.abspath(__file__))
FOR_WORKERS = os.path.exists(os.path.join(_HERE, WORKER_FILE))


class sdist(_sdist):
    """The sdist, with WORKER_FILE (the pipelines' requirements, one a line) when WORKER_ENV is 1."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if os.environ.get(WORKER_ENV) == "1":
            with open(os.path.join(base_dir, WORKER_FILE), "w", encoding="utf-8") as f:
                f.write("\n".join(PIPELINES) + "\n")


setuptools.setup(
    name="tfrecord-etl",
    version="0.1.0",
    description="Batch ETL on Apache Beam: NumPy arrays -> sharded TFRecord files of tf.train.Example",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10,<3.13",
    packages=["tfrecord_etl"]
    + [
        f"tfrecord_etl.{p}"
        for p in setuptools.find_packages(include=[f for folder in _FOLDERS for f in (folder, folder + ".*")])
    ],
    package_dir={"tfrecord_etl": "tfrecord_etl", **{f"tfrecord_etl.{f}": f for f in _FOLDERS}},
    entry_points={"console_scripts": ["tfrecord-etl = tfrecord_etl.pipelines.cli:console"]},
    cmdclass={"sdist": sdist},
    install_requires=READER + (PIPELINES if FOR_WORKERS else []),
    extras_require={
        "beam": PIPELINES,
        # gs:// reads without Beam (the reader's own client; apache-beam[gcp] brings it with the pipelines)
        "gcs": ["google-cloud-storage>=2.14"],
        # everything: the pipelines, s3:// and gs:// (with Beam's filesystems), DaskRunner, --tfds_name
        "all": PIPELINES
        + ["boto3>=1.34,<2", "dask>=2024.4.2", "distributed>=2024.4.2", "tensorflow-datasets>=4.9.10,<5"],
        "test": PIPELINES
        + _DOCS
        + [
            "pytest>=8",
            "hypothesis>=6.100",
            "pytest-timeout>=2.3",
            # ./run_tests.sh runs the suite on two workers (-n 2 --dist loadgroup; tests/conftest.py groups them)
            "pytest-xdist==3.8.0",
            # configs/lint.sh (types over the public API) and the import layers' contracts (.importlinter)
            "mypy==2.4.1",
            "import-linter==2.16",
            # TFDS's own Tensor(encoding=ZLIB) encoder: the zlib encoding is checked byte for byte against it
            "tensorflow-datasets>=4.9.10,<5",
            # the `tfrecord` package (PyTorch readers): its multi-worker path reads our --index files
            "tfrecord>=1.14,<2",
            # Grain's MapDataset reads reader.RandomAccess as its random-access data source
            "grain>=0.2.18,<0.3",
            # the runner matrix (DaskRunner) and the S3 tests (a moto server) run in CI
            "dask>=2024.4.2",
            "distributed>=2024.4.2",
            "boto3>=1.34,<2",
            "moto[server]>=5.0",
            # a Google Cloud Storage API on 127.0.0.1 (ranged downloads): the gs:// read tests
            "gcp-storage-emulator>=2026.7.19",
            # a MATLAB v7.3 writer: the v7.3 twins of SciPy's v5 test files (both must convert alike)
            "hdf5storage>=0.2.2,<0.3",
            # Zarr stores (zarr 3.1 is the last for Python 3.11) and the xarray that writes the test stores
            "zarr>=3.1.6,<4",
            "xarray>=2024.1",
            # Spectral Python writes and reads ENVI image cubes: the ENVI source is checked against its files
            "spectral==0.25",
            # PyTables: pandas' HDFStore (df.to_hdf(format="table")) writes the categorical test files with it
            "tables>=3.9",
            # nibabel, the field's NIfTI reader: the NIfTI source reads with it and is checked against nibabel.load
            "nibabel==5.4.2",
            # --format fits: the FITS source reads through astropy.io.fits (its test files are the fixtures')
            "astropy==8.0.2",
        ],
        # --format nifti: NIfTI-1/-2 images (.nii, .nii.gz, .hdr/.img) through nibabel's headers and ArrayProxy
        "nifti": ["nibabel>=5.2,<6"],
        # --runner DaskRunner (apache-beam[dask] asks for the same ranges); see docs/scale.md.
        "dask": ["dask>=2024.4.2", "distributed>=2024.4.2"],
        # s3:// inputs and outputs through Beam's S3 filesystem (apache-beam[aws] is boto3>=1.9,<2), and s3:// reads
        # of the reader without Beam; the tests' local S3 API (moto[server]) is in "test".
        "s3": ["boto3>=1.34,<2"],
        # --tfds_name: TFDS's DatasetInfo writes dataset_info.json and features.json
        "tfds": ["tensorflow-datasets>=4.9.10,<5"],
        # python -m bench.run (not part of the test suite): the PNG chart and process-tree peak RSS.
        "bench": ["matplotlib>=3.8", "psutil>=5.9"],
        # --format zarr: Zarr v2/v3 stores through the reference implementation and its codecs (numcodecs)
        "zarr": ["zarr>=3.1.6,<4"],
        # --format fits: FITS images and tables through astropy.io.fits
        "fits": ["astropy>=8.0.2,<9"],
        "docs": _DOCS,
        # tfrecord_etl.tfx (ArraysExampleGen): TFX 1.21 matches the TensorFlow / Beam / tfx-bsl pins above; its
        # pyarrow<19 pin differs from the main environment's, so CI tests it in its own venv (configs/tfx/)
        "tfx": ["tfx>=1.21,<1.22"],
    },
)
