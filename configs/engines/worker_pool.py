"""Beam's Python worker pool (``apache_beam.runners.worker.worker_pool_main``) for several TaskManagers or Spark
executors on one machine: the same service, with each SDK harness process keyed by the runner's connection as well
as by its worker id.

Why: on a real cluster the pool is a sidecar of one TaskManager (Beam's Flink-on-Kubernetes pattern). Here two
TaskManagers share one pool on loopback, and Beam's Java runners number their workers per JVM ("1-1", "2-1", ... in
every TaskManager), while the stock pool keeps its harness processes in a dict keyed by that id alone. So a
TaskManager that closes its environment (``StopWorker("2-1")``) kills the OTHER TaskManager's harness "2-1" if that
one started last: the other task waits for a harness that is gone and the job hangs (seen on Flink 1.16 with Beam's
2.50 job server: a WriteMetadata subtask RUNNING for minutes with no harness, "FnApiControlClient received an error.
CANCELLED: client cancelled" in its TaskManager's log 0.9 s after the harness connected).

Beam's ExternalEnvironmentFactory opens one gRPC channel per environment and sends StartWorker and StopWorker over
it, then shuts it down, so the channel's peer address (the client's ip:port) tells the environments apart. A
StopWorker whose peer is unknown (the channel reconnected in between) stops the harness with that id only when
exactly one has it; otherwise none (each harness exits by itself once its control stream closes, which the runner
does just before StopWorker).

    python -m configs.engines.worker_pool --service_port=PORT
"""

from __future__ import annotations

import argparse
import atexit
import logging
import threading
import time

import grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.worker import worker_pool_main
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer
from apache_beam.utils import thread_pool_executor

_LOGGER = logging.getLogger(__name__)


class PeerKeyedWorkerPool(BeamFnExternalWorkerPoolServicer):
    """``BeamFnExternalWorkerPoolServicer`` whose harness processes are keyed by ``(peer, worker_id)``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._by_peer: dict[tuple[str, str], object] = {}  # (peer, worker id) -> subprocess.Popen

    def StartWorker(self, start_worker_request, unused_context):  # noqa: N802 - the gRPC method name
        peer = unused_context.peer() if unused_context is not None else ""
        with self._lock:
            response = super().StartWorker(start_worker_request, unused_context)
            proc = self._worker_processes.pop(start_worker_request.worker_id, None)
            if proc is not None:
                self._by_peer[(peer, start_worker_request.worker_id)] = proc
        return response

    def StopWorker(self, stop_worker_request, unused_context):  # noqa: N802 - the gRPC method name
        peer = unused_context.peer() if unused_context is not None else ""
        worker_id = stop_worker_request.worker_id
        with self._lock:
            proc = self._by_peer.pop((peer, worker_id), None)
            if proc is None:
                same_id = [key for key in self._by_peer if key[1] == worker_id]
                if len(same_id) == 1:
                    proc = self._by_peer.pop(same_id[0])
                elif same_id:
                    _LOGGER.warning(
                        "StopWorker(%s) from %s: %d harnesses have that id, none from this peer: "
                        "each exits when its control stream closes",
                        worker_id,
                        peer,
                        len(same_id),
                    )
            if proc is None:
                return super().StopWorker(stop_worker_request, unused_context)
            self._worker_processes[worker_id] = proc
            return super().StopWorker(stop_worker_request, unused_context)

    def kill_all(self) -> None:
        with self._lock:
            procs = list(self._by_peer.values())
            self._by_peer.clear()
        for proc in procs:
            worker_pool_main.kill_process_gracefully(proc)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service_port", type=int, required=True)
    args = parser.parse_args(argv)
    # what BeamFnExternalWorkerPoolServicer.start does, with this class and its own exit hook
    server = grpc.server(
        thread_pool_executor.shared_unbounded_instance(),
        options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)],
    )
    port = server.add_insecure_port(f"[::]:{args.service_port}")
    pool = PeerKeyedWorkerPool(use_process=True, state_cache_size=0, data_buffer_time_limit_ms=-1)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.start()
    atexit.register(pool.kill_all)
    logging.getLogger().setLevel(logging.INFO)
    _LOGGER.info("Started the peer-keyed worker pool at localhost:%s", port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    main()
