"""User functions for the augment tests (``--fn tests.augment_fns:NAME``)."""

from __future__ import annotations

import numpy as np


def add_one(features):
    """Per example: ``id_plus_one`` = ``id`` + 1 (same dtype and shape as ``id``)."""
    return {"id_plus_one": features["id"] + 1}


def mass_kg(features):
    """Per batch (penguin): ``mass_x2`` float32 (rows,) = 2 * body_mass_g, ``is_adelie`` bool (rows,)."""
    return {
        "mass_x2": (features["body_mass_g"][:, 0] * 2).astype(np.float32),
        "is_adelie": features["species"][:, 0] == 0,
    }


def norm_and_tag(features):
    """Per batch: ``x_norm`` = L2 norm of ``x`` (float32), ``tag`` = b"even"/b"odd" by ``id``."""
    return {
        "x_norm": np.linalg.norm(features["x"], axis=1).astype(np.float32),
        "tag": np.where(features["id"].reshape(-1) % 2 == 0, b"even", b"odd"),
    }


def double_x(features):
    """Per example: a new ``x`` = 2 * old ``x`` (for --replace_fields x)."""
    return {"x": (features["x"] * 2).astype(np.float32)}


def fail_late(features):
    """Per example: raises on id 250, so a run fails in a late batch."""
    if int(np.asarray(features["id"]).reshape(-1)[0]) == 250:
        raise ValueError("boom at id 250")
    return {"ok": np.int64(1)}


def mask_and_noise(features):
    """Per batch: ``mask`` bool (rows, 3, 10) from ``id``'s bits, ``noise`` float32 (rows, 16) mostly zeros."""
    ids = np.asarray(features["id"]).reshape(-1)
    mask = ((ids[:, None, None] >> np.arange(30).reshape(3, 10)) & 1).astype(bool)
    noise = np.zeros((len(ids), 16), np.float32)
    noise[:, 0] = ids
    return {"mask": mask, "noise": noise}


def mask_and_noise_of_array(features):
    """``mask_and_noise`` of a ``.npy`` conversion's ``array`` feature."""
    return mask_and_noise({"id": features["array"]})


def count_values(features):
    """Per example (foreign collections): ``n_<name>`` int64 = how many values each input feature holds (its
    1-D VarLen array's length; 0 where the record has none)."""
    return {f"n_{name}": np.int64(np.asarray(value).shape[0]) for name, value in features.items()}


def label_times_two(features):
    """Per example (collection tests): ``label2`` = 2 * ``label`` (int64)."""
    return {"label2": np.asarray(features["label"] * 2, np.int64)}


def fail_on_span_4(features):
    """Per example (collection tests): raises on label 4000, the first record of span 4."""
    if int(np.asarray(features["label"]).reshape(-1)[0]) == 4000:
        raise ValueError("boom at label 4000")
    return {"ok": np.int64(1)}


def slow_add_one(features):
    """Per example: :func:`add_one` after 0.25 s (a job that runs for a while: the engine tests that stop one)."""
    import time

    time.sleep(0.25)
    return add_one(features)


def calibrated(features):
    """Per example: ``id_cal`` = ``id`` * ``SCALE`` of the module ``tfrecord_etl_calibration``, imported when called
    (the engine test puts it on the launcher's path only, as a package installed on the launcher but not on the
    workers)."""
    import tfrecord_etl_calibration  # imported where the function runs

    return {"id_cal": features["id"] * tfrecord_etl_calibration.SCALE}
