"""The object-creation tests of ``tests/test_object_create.py`` (shards created under their final names at once)
against the real servers of this stage: SeaweedFS's S3 gateway and fake-gcs-server (configs/engines/stores.py),
each in this process (no engine: the requests are the store's). What moto and the GCS emulator do with a multipart
completion or a resumable session refused by ``If-None-Match: *`` / ``ifGenerationMatch=0`` is not evidence of
what a real server does: here it is asked."""

from __future__ import annotations

import os

import pytest

from tests import gcs_emulator
from tests.test_object_create import (  # noqa: F401 - collected here, with this module's store fixture
    Store,
    test_a_convert_writes_each_shard_once,
    test_a_name_taken_before_the_upload_started,
    test_a_second_attempt_with_the_same_bytes_keeps_the_first,
    test_an_error_leaves_no_object_and_no_upload,
    test_other_bytes_under_the_name_are_replaced_once,
    test_the_commit_aborts_a_killed_writers_upload_of_its_names_only,
    test_the_object_appears_whole_only_when_finished,
)


@pytest.fixture(scope="module", params=["s3", "gs"])
def store(request):
    """A :class:`Store` on a bucket of SeaweedFS (``s3``: its credentials in this process's environment, as a
    worker pool has them) or fake-gcs-server (``gs``)."""
    from tfrecord_etl.pipelines import common

    if request.param == "s3":
        seaweed = request.getfixturevalue("seaweed")
        saved = {k: os.environ.get(k) for k in seaweed.env()}
        os.environ.update(seaweed.env())
        try:
            common.configure_filesystems(seaweed.flags())
            yield Store("s3", seaweed.bucket("objcreate")[5:], seaweed.flags(), seaweed.client())
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        return
    fakegcs = request.getfixturevalue("fakegcs")
    with gcs_emulator.emulator_host(fakegcs.endpoint):
        from google.cloud import storage

        yield Store("gs", fakegcs.bucket("objcreate")[5:], [], storage.Client.create_anonymous_client())
