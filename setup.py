"""tfrecord-etl: NumPy arrays (HDF5, .npz, .npy) -> sharded TFRecord files of tf.train.Example on Apache Beam.

Installs one import package, ``tfrecord_etl``, holding the repo's ``transforms/`` and ``pipelines/`` folders as
``tfrecord_etl.transforms`` and ``tfrecord_etl.pipelines`` (other PyPI distributions install top-level
``transforms`` and ``pipelines`` packages: ours never shadow theirs), and the console command ``tfrecord-etl``.
Also usable as Beam's ``--setup_file`` so Dataflow workers install the same packages.
"""
import setuptools

_FOLDERS = ("transforms", "pipelines")  # the repo's top-level folders, installed under tfrecord_etl

setuptools.setup(
    name="tfrecord-etl",
    version="0.1.0",
    description="Batch ETL on Apache Beam: NumPy arrays -> sharded TFRecord files of tf.train.Example",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=["tfrecord_etl"] + [f"tfrecord_etl.{p}" for p in setuptools.find_packages(
        include=[f for folder in _FOLDERS for f in (folder, folder + ".*")])],
    package_dir={"tfrecord_etl": "tfrecord_etl", **{f"tfrecord_etl.{f}": f for f in _FOLDERS}},
    entry_points={"console_scripts": ["tfrecord-etl = tfrecord_etl.pipelines.cli:console"]},
    install_requires=[
        # tfx-bsl 1.21 pins tensorflow 2.21 and apache-beam[gcp]; these ranges resolve together on Python 3.11.
        "apache-beam[gcp]>=2.77,<2.78",
        "tensorflow>=2.21,<2.22",
        "tfx-bsl>=1.21,<1.22",
        "tensorflow-metadata>=1.17",
        "numpy>=1.26",
        "h5py>=3.10",
        "google-crc32c>=1.5",
        "pydantic>=2.5",
        "PyYAML>=6.0",
        "tqdm>=4.66",
        # NetCDF-3 classic / 64-bit offset files (scipy.io.netcdf_file, memory-mapped); netCDF-4 goes through h5py
        "scipy>=1.11",
        # HDF5 filter plugins (Blosc, Blosc2, BZip2, LZ4, Zstd, Bitshuffle, SZ, ZFP, ...), registered before any HDF5
        # file is opened: a 46.4 MB wheel (7.1.0, manylinux x86_64), 185 MB installed, next to TensorFlow's 1.9 GB
        "hdf5plugin>=4.1",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3",
                 # TFDS's own Tensor(encoding=ZLIB) encoder: the zlib encoding is checked byte for byte against it
                 "tensorflow-datasets>=4.9.10,<5",
                 # the `tfrecord` package (PyTorch readers): its multi-worker path reads our --index files
                 "tfrecord>=1.14,<2",
                 # Grain's MapDataset reads reader.RandomAccess as its random-access data source
                 "grain>=0.2.18,<0.3",
                 # the runner matrix (DaskRunner) and the S3 tests (a moto server) run in CI
                 "dask>=2024.4.2", "distributed>=2024.4.2", "boto3>=1.34,<2", "moto[server]>=5.0",
                 # a Google Cloud Storage API on 127.0.0.1 (ranged downloads): the gs:// read tests
                 "gcp-storage-emulator>=2026.7.19",
                 # a MATLAB v7.3 writer: the v7.3 twins of SciPy's v5 test files (both must convert alike)
                 "hdf5storage>=0.2.2,<0.3"],
        # --runner DaskRunner (apache-beam[dask] asks for the same ranges); see "Running at scale" in the README.
        "dask": ["dask>=2024.4.2", "distributed>=2024.4.2"],
        # s3:// inputs and outputs through Beam's S3 filesystem (apache-beam[aws] is boto3>=1.9,<2);
        # moto[server] is the local S3 API the tests run against.
        "s3": ["boto3>=1.34,<2", "moto[server]>=5.0"],
        # --tfds_name: TFDS's DatasetInfo writes dataset_info.json and features.json
        "tfds": ["tensorflow-datasets>=4.9.10,<5"],
        # python -m bench.run (not part of the test suite): the PNG chart and process-tree peak RSS.
        "bench": ["matplotlib>=3.8", "psutil>=5.9"],
        # tfrecord_etl.tfx (ArraysExampleGen): TFX 1.21 matches the TensorFlow / Beam / tfx-bsl pins above; its
        # pyarrow<19 pin differs from the main environment's, so CI tests it in its own venv (configs/tfx/)
        "tfx": ["tfx>=1.21,<1.22"],
    },
)
