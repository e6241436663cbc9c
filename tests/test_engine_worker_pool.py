"""The worker pool the engines stage runs beside two TaskManagers (configs/engines/worker_pool.py): two runners that
number their workers alike ("1-1" in each JVM) must each stop only their own SDK harness. Beam's stock pool keys
its harness processes by worker id alone, so the second runner's StopWorker killed the first runner's harness and a
Flink job hung (a subtask RUNNING with no harness). No cluster needed: two gRPC channels play the two runners."""

from __future__ import annotations

import os
import sys
import time

import grpc
import pytest

pytest.importorskip("apache_beam")

from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer
from apache_beam.utils import thread_pool_executor

from configs.engines.worker_pool import PeerKeyedWorkerPool


def _serve(servicer):
    server = grpc.server(thread_pool_executor.shared_unbounded_instance())
    port = server.add_insecure_port("127.0.0.1:0")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(servicer, server)
    server.start()
    return server, port


def _two_runners_start_and_one_stops(servicer_cls):
    """Two channels (two runners) start worker "1-1" each; the first stops its own. Returns the harness processes
    of the first and of the second runner, in that order, after the stop."""
    pool = servicer_cls(use_process=True, state_cache_size=0, data_buffer_time_limit_ms=-1)
    server, port = _serve(pool)
    # a connection of its own per channel, as two JVMs have (Python's gRPC would otherwise share one)
    channels = [
        grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)
    ]
    procs = []
    try:
        for channel in channels:
            # a control endpoint nobody serves: the harness waits for it, alive, until it is stopped
            request = beam_fn_api_pb2.StartWorkerRequest(
                worker_id="1-1", control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:9")
            )
            response = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel).StartWorker(request)
            assert response.error == ""
            procs.append(_newest_harness(pool, procs))
        time.sleep(1.0)
        assert [p.poll() for p in procs] == [None, None], "a harness died on its own: the test proves nothing"
        stop = beam_fn_api_pb2.StopWorkerRequest(worker_id="1-1")
        assert beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channels[0]).StopWorker(stop).error == ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        time.sleep(0.5)
        return [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for channel in channels:
            channel.close()
        server.stop(0)


def _newest_harness(pool, known):
    everything = list(pool._worker_processes.values()) + list(getattr(pool, "_by_peer", {}).values())
    new = [p for p in everything if all(p is not k for k in known)]
    assert len(new) == 1, new
    return new[0]


@pytest.fixture(autouse=True)
def _this_python_first_on_path(monkeypatch):
    """The pool starts each harness as ``python -c ...``: the first python on PATH must have Beam."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def test_each_runner_stops_only_its_own_harness():
    first, second = _two_runners_start_and_one_stops(PeerKeyedWorkerPool)
    assert first is not None, "the first runner's harness should have been stopped"
    assert second is None, "the second runner's harness was stopped by the first runner's StopWorker"


def test_the_stock_pool_stops_the_other_runners_harness():
    """What the engines stage works around: with Beam's own pool, the same calls stop the wrong process."""
    first, second = _two_runners_start_and_one_stops(BeamFnExternalWorkerPoolServicer)
    assert first is None and second is not None
