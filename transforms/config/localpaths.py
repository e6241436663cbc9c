"""The local paths of a command's options made absolute in the launcher, before planning.

Why: the plan names files by the paths it was given, and the workers open them. A worker whose working directory
is not the launcher's (a Flink TaskManager, a Spark executor, an SDK harness of an EXTERNAL or DOCKER environment)
read ``--input rel/x.nc`` as another file (``InputChangedError``: it is gone) and wrote ``--output_dir out/x`` into a
directory of its own (the run's lock lost), leaving folders in its working directory. Resolved against the
launcher's working directory, every worker names the same file; it still has to reach it (a shared mount, or
s3:// / gs://: docs/scale.md).
"""

from __future__ import annotations

from tfrecord_etl.transforms.storage.fileio import absolute

# the options that name a local file, pattern or directory: convert's and augment's (a model has those it declares)
PATH_FIELDS = ("input", "output_dir", "dead_letter_dir", "join_input", "input_schema", "file_labels")
NOT_A_PATH = {"file_labels": {"dir", "none"}}  # the values of a path option that name no file


def absolute_paths(cfg):
    """``cfg`` (a frozen pydantic model of a command's options: ``ConvertConfig``, ``AugmentConfig``) with every
    local path option of :data:`PATH_FIELDS` it has made absolute (``fileio.absolute``); ``cfg`` itself when none
    changes."""
    update = {}
    for name in PATH_FIELDS:
        value = getattr(cfg, name, None) if name in type(cfg).model_fields else None
        if isinstance(value, str) and value not in NOT_A_PATH.get(name, ()) and absolute(value) != value:
            update[name] = absolute(value)
    return cfg.model_copy(update=update) if update else cfg
