"""gcp-storage-emulator with Google Cloud Storage's request preconditions: the GCS server the tests start.

A test double of documented GCS semantics, not of this project's code. gcp-storage-emulator (2026.7.19) accepts
``ifGenerationMatch`` on every request and ignores it, so a conditional write that real GCS refuses (the commit of
``metadata.json``, the creation and take-over of an output directory's lock, the compare-and-swap of
``collection.json``) succeeds on it, and none of them would be tested. This module adds, in the emulator's process,
what "Request preconditions" (https://cloud.google.com/storage/docs/request-preconditions) and the JSON API
reference of ``objects.insert`` / ``get`` / ``delete`` / ``patch`` document for ``ifGenerationMatch``:

- a request with ``ifGenerationMatch=0`` proceeds only if the object has no live version;
- ``ifGenerationMatch=N`` (N > 0) only if the object's live generation is N;
- otherwise it fails with HTTP 412 Precondition Failed (google-cloud-storage raises
  ``google.api_core.exceptions.PreconditionFailed``) and changes nothing; a GET or DELETE of a missing object
  stays a 404.

It applies to uploads (``uploadType=media``, ``multipart``, and ``resumable``: checked when the session is
started and again on each of its PUTs, so a session whose object changed meanwhile cannot finalize), object
metadata and media GETs, DELETE and PATCH of the JSON API. Each check and the write it guards run under one lock,
so they are atomic as on GCS. It also keeps an object's generation increasing: the emulator numbers a generation
with the clock when the upload *starts* (``time.time_ns()`` in ``_make_object_resource``), so of two overlapping
resumable uploads the one finalized last could get the lower number; here a new generation is always higher than
every earlier one of that name, deleted ones included (GCS: "each time you upload a new version ... the Blob's
generation is increased", google-cloud-storage's ``generation_metageneration`` docs).

Not covered (the project does not send them): ``ifGenerationNotMatch``, ``ifMetagenerationMatch``, the XML API's
``x-goog-if-generation-match`` header, preconditions on copy, rewrite and compose. Replace this module with the
plain emulator once gcp-storage-emulator evaluates preconditions itself (``tests/test_gcs_emulator.py`` checks that
the plain one still does not: it fails the day it does).

Run: ``python -m tests.gcs_emulator start --host 127.0.0.1 --port N --in-memory --default-bucket B --quiet`` (the
emulator's own command line); :func:`start` does it from a test.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from http import HTTPStatus

ROOT = pathlib.Path(__file__).resolve().parent.parent
_LOCK = threading.RLock()  # one precondition check and the write it guards at a time
_HIGHEST: dict[tuple[str, str], int] = {}  # (bucket, object name) -> the highest generation it ever had


def _generation(storage, bucket: str, name: str) -> int | None:
    """The live generation of ``bucket/name``, None when there is none."""
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return int(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return None


def _target(request, storage) -> tuple[str, str | None]:
    """(bucket, object name) a request acts on: the path's object, an upload's ``name`` (query or metadata), or
    the object of a resumable session."""
    params = request.params or {}
    if "upload_id" in request.query:
        session = storage.get_resumable_file_obj(request.query["upload_id"][0])
        return session["bucket"], session["name"]
    if "object_id" in params:
        return params["bucket_name"], params["object_id"]
    if "name" in request.query:
        return params.get("bucket_name"), request.query["name"][0]
    data = request.data
    meta = (data.get("meta") if "meta" in data else data) if isinstance(data, dict) else {}
    return params.get("bucket_name"), (meta or {}).get("name")


def _precondition_failed(request, storage, write: bool) -> str | None:
    """Why the request's ``ifGenerationMatch`` does not hold, or None when it holds (or there is none)."""
    values = request.query.get("ifGenerationMatch")
    if not values:
        return None
    from gcp_storage_emulator.exceptions import NotFound

    try:
        bucket, name = _target(request, storage)
    except NotFound:
        return None  # an unknown upload session: the handler answers 404
    current = _generation(storage, bucket, name) if name else None
    expected = int(values[0])
    if current is None and not write:
        return None  # a GET or DELETE of a missing object: 404, as GCS answers
    if (expected == 0 and current is None) or (expected != 0 and current == expected):
        return None
    return f"ifGenerationMatch={expected}, live generation {current if current is not None else 'none'}"


def _conditional(handler, write: bool):
    def handle(request, response, storage, *args, **kwargs):
        with _LOCK:
            why = _precondition_failed(request, storage, write)
            if why is not None:
                response.status = HTTPStatus.PRECONDITION_FAILED
                message = "At least one of the pre-conditions you specified did not hold."
                response.json(
                    {
                        "error": {
                            "code": 412,
                            "message": message,
                            "errors": [
                                {
                                    "domain": "global",
                                    "reason": "conditionNotMet",
                                    "message": message,
                                    "locationType": "header",
                                    "location": "If-Match",
                                    "debugInfo": why,
                                }
                            ],
                        }
                    }
                )
                return None
            return handler(request, response, storage, *args, **kwargs)

    handle.__wrapped__ = handler
    return handle


def _increasing_generations(create_file):
    def create(self, bucket_name, file_name, content, file_obj, file_id=None):
        with _LOCK:
            floor = max(_HIGHEST.get((bucket_name, file_name), 0), _generation(self, bucket_name, file_name) or 0)
            old = str(file_obj["generation"])
            if int(old) <= floor:
                new = str(floor + 1)
                file_obj["generation"] = new
                for key in ("id", "mediaLink"):
                    if isinstance(file_obj.get(key), str):
                        file_obj[key] = file_obj[key].replace(old, new)
            _HIGHEST[(bucket_name, file_name)] = int(file_obj["generation"])
            return create_file(self, bucket_name, file_name, content, file_obj, file_id)

    create.__wrapped__ = create_file
    return create


def install() -> None:
    """Patches the emulator's object handlers (in this process) as the module docstring says. Idempotent."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.storage import Storage

    if getattr(Storage.create_file, "__wrapped__", None) is not None:
        return
    writes = {objects.insert, objects.upload_partial, objects.delete, objects.patch}
    reads = {objects.get, objects.download}
    wrapped = {fn: _conditional(fn, fn in writes) for fn in writes | reads}
    server.HANDLERS = tuple(
        (regex, {method: wrapped.get(fn, fn) for method, fn in handlers.items()}) for regex, handlers in server.HANDLERS
    )
    for name in ("insert", "upload_partial"):  # the router's fallback and insert's own call go through the module
        setattr(objects, name, wrapped[getattr(objects, name)])
    Storage.create_file = _increasing_generations(Storage.create_file)


@contextlib.contextmanager
def server(bucket: str, preconditions: bool = True) -> Iterator[int]:
    """The emulator (:func:`start`) on a free port, listening; yields the port and stops it after."""
    from bench.remote import free_port, wait_for

    port = free_port()
    process = start(port, bucket, preconditions)
    try:
        wait_for(port)
        yield port
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def emulator_host(url: str) -> Iterator[str]:
    """``STORAGE_EMULATOR_HOST=url`` while the block runs (google-cloud-storage, so Beam's GCS filesystem and our
    reads, go there), the clients our ``fileio`` cached dropped before and after; the old value restored."""
    from tfrecord_etl.transforms.storage import gcsaccess, remote

    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = url
    gcsaccess.connect_to_gcs_anonymously()  # the emulator takes no credentials: no 20 s search for them
    remote.CLIENTS.clear()
    try:
        yield url
    finally:
        remote.CLIENTS.clear()
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


def start(port: int, bucket: str, preconditions: bool = True) -> subprocess.Popen:
    """Starts the emulator (in memory, with ``bucket``, on 127.0.0.1:``port``) in its own process; with
    ``preconditions`` False, the plain gcp-storage-emulator (what the tests show it lacks). The caller waits for
    the port and terminates the process."""
    module = "tests.gcs_emulator" if preconditions else "gcp_storage_emulator"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--default-bucket",
            bucket,
            "--quiet",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    install()
    from gcp_storage_emulator.__main__ import main

    main(sys.argv[1:])
