"""Reusable PTransforms, DoFns, the example codec, the sources and the reader of tfrecord-etl.

This folder is the package ``tfrecord_etl.transforms`` (setup.py's ``package_dir``), its only module name."""

if __name__ == "transforms":  # this folder by its bare name (a checkout's root on sys.path): a second copy of
    # every module, with its own error classes and registries, would load beside tfrecord_etl.transforms
    raise ImportError(
        "this package is tfrecord_etl.transforms: import tfrecord_etl.transforms.X, not transforms.X "
        "(one name per module)",
        name=__name__,
    )
