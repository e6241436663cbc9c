"""The GCS server of the tests (``tests/gcs_emulator.py``: gcp-storage-emulator plus GCS's documented
``ifGenerationMatch`` semantics and increasing generations), checked with the plain google-cloud-storage client,
next to the plain emulator, which shows why the extension exists (its tests here fail the day the emulator
evaluates preconditions itself: then drop the extension)."""

from __future__ import annotations

import pytest

from tests import gcs_emulator

pytest.importorskip("gcp_storage_emulator", reason="pip install -e .[test]")
BUCKET = "etl-preconditions"


@pytest.fixture(scope="module", params=[True, False], ids=["extended", "plain"])
def server(request):
    """(google-cloud-storage bucket, True for the extended emulator / False for the plain one)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with gcs_emulator.server(BUCKET, preconditions=request.param) as port:
        client = storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": f"http://127.0.0.1:{port}"},
        )
        yield client.bucket(BUCKET), request.param


def test_a_write_on_a_stale_generation_is_refused_with_412(server):
    from google.api_core.exceptions import PreconditionFailed

    bucket, extended = server
    blob = bucket.blob("stale/x")
    blob.upload_from_string(b"first")
    first = blob.generation
    blob.upload_from_string(b"second")
    second = blob.generation
    assert second > first
    if not extended:  # the plain emulator accepts what GCS refuses: why tests/gcs_emulator.py exists
        bucket.blob("stale/x").upload_from_string(b"third", if_generation_match=first)
        assert bucket.blob("stale/x").download_as_bytes() == b"third"
        bucket.blob("stale/x").upload_from_string(b"fourth", if_generation_match=0)
        assert bucket.blob("stale/x").download_as_bytes() == b"fourth"
        return
    with pytest.raises(PreconditionFailed):
        bucket.blob("stale/x").upload_from_string(b"third", if_generation_match=first)
    with pytest.raises(PreconditionFailed):  # 0: only when there is no live version
        bucket.blob("stale/x").upload_from_string(b"third", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob("stale/x").delete(if_generation_match=first)
    with pytest.raises(PreconditionFailed):  # a read pinned to a replaced generation
        bucket.blob("stale/x").download_as_bytes(if_generation_match=first)
    assert bucket.get_blob("stale/x").generation == second
    assert bucket.blob("stale/x").download_as_bytes() == b"second"  # nothing changed
    replaced = bucket.blob("stale/x")
    replaced.upload_from_string(b"third", if_generation_match=second)  # the live generation: proceeds
    assert replaced.generation > second and replaced.download_as_bytes() == b"third"
    created = bucket.blob("stale/new")
    created.upload_from_string(b"new", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob("stale/missing").upload_from_string(b"x", if_generation_match=created.generation)
    assert bucket.get_blob("stale/missing") is None
    bucket.blob("stale/new").delete(if_generation_match=created.generation)
    assert bucket.get_blob("stale/new") is None


def test_a_resumable_upload_is_checked_when_it_finalizes(server):
    """The session is started while the precondition holds; another writer replaces the object before its data
    is sent: GCS refuses the session's final PUT."""
    import requests

    bucket, extended = server
    blob = bucket.blob("resumable/x")
    blob.upload_from_string(b"old")
    session = bucket.blob("resumable/x").create_resumable_upload_session(size=3, if_generation_match=blob.generation)
    bucket.blob("resumable/x").upload_from_string(b"new")  # another writer, unconditional
    answer = requests.put(session, data=b"mine", timeout=30)
    assert answer.status_code == (412 if extended else 200)
    assert bucket.blob("resumable/x").download_as_bytes() == (b"new" if extended else b"mine")


def test_generations_increase_when_overlapping_uploads_finalize_out_of_order(server):
    """Two resumable sessions of one object, the first started finalized last: on GCS its generation is the
    higher (the live version is the newest); the plain emulator numbers it by its start and gives it the lower."""
    import requests

    bucket, extended = server
    early = bucket.blob("order/x").create_resumable_upload_session(size=1)
    late = bucket.blob("order/x").create_resumable_upload_session(size=1)
    second = int(requests.put(late, data=b"L", timeout=30).json()["generation"])
    last = int(requests.put(early, data=b"E", timeout=30).json()["generation"])
    assert bucket.get_blob("order/x").generation == last
    if extended:
        assert last > second
    else:
        assert last < second
