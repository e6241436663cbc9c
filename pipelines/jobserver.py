"""Before a portable runner's job is planned: does anything answer at its job server's address.

Without this check, ``--runner PortableRunner --job_endpoint 127.0.0.1:8099`` (or ``configs/flink-local.yaml``,
``configs/spark-local.yaml``) with no job server there planned the job, wrote the output directory's run marker and
lock, then waited about five minutes in Beam's gRPC channel (``grpc.channel_ready_future(...).result(timeout)``
in ``apache_beam/runners/portability/portable_runner.py``, once per attempt) and ended in a raw
``grpc.FutureTimeoutError`` traceback, silent even with ``--verbose``. Here one TCP connection to each address the
launcher will dial (``--job_endpoint``, and ``--artifact_endpoint`` when given), bounded by
:data:`gcsaccess.CONNECT_TIMEOUT` seconds, decides it before anything is read or written.

``--job_endpoint embed`` (Beam's job server in this process), no ``--job_endpoint`` (FlinkRunner and SparkRunner
start a job server of their own; other runners ignore it) and gRPC targets other than ``HOST:PORT`` (``unix:``,
``dns:///...``) are not checked. The SDK harness's ``--environment_config`` is not either: the job server's
workers dial it, from their own network (``localhost:50000`` beside each TaskManager is not the launcher's).
"""

from __future__ import annotations

import re

from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions

from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.storage.gcsaccess import unreachable

# the runners that dial --job_endpoint (Beam's names, which it also takes lowercased and without "Runner")
PORTABLE_RUNNERS = frozenset({"portablerunner", "flinkrunner", "sparkrunner", "prismrunner"})
_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>\d+)$")


def host_port(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of a gRPC target ``HOST:PORT`` or ``[IPv6]:PORT``; None for any other form (``embed``,
    ``unix:path``, ``dns:///host:port``) or a port outside 1-65535."""
    m = _HOST_PORT.match(endpoint.strip())
    if m is None or not 0 < int(m["port"]) < 65536:
        return None
    return m["v6"] or m["host"], int(m["port"])


def check(beam_argv: list[str]) -> None:
    """Checks that the job server (``--job_endpoint``) and, when given, the artifact service
    (``--artifact_endpoint``) of the pipeline options ``beam_argv`` accept a TCP connection, for a runner of
    :data:`PORTABLE_RUNNERS`; nothing to do without ``--job_endpoint``, for ``--job_endpoint embed`` (its artifact endpoint is still checked), or for a target
    that is not ``HOST:PORT``.

    Raises:
      ConfigError: one line naming the flag, the address and the reason (refused, no answer within
        :data:`gcsaccess.CONNECT_TIMEOUT` seconds, a name that does not resolve), and what to do: start the job
        server there, or name a running one with ``--job_endpoint`` (the command line wins over a config file's
        ``pipeline_options``), or ``--job_endpoint embed``.
    """
    options = PipelineOptions([str(a) for a in beam_argv])
    portable = options.view_as(PortableOptions)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    name = runner.rpartition(".")[2].lower()
    job = (portable.job_endpoint or "").strip()
    if not job or (name if name.endswith("runner") else name + "runner") not in PORTABLE_RUNNERS:
        return
    for flag, endpoint in (("--job_endpoint", job), ("--artifact_endpoint", portable.artifact_endpoint)):
        address = host_port(endpoint or "")  # None for embed
        if address is None:
            continue
        reason = unreachable(*address)
        if reason is None:
            continue
        if flag == "--job_endpoint":
            raise ConfigError(
                f"Cannot reach the job server of --runner {runner} at --job_endpoint {endpoint}: {reason}",
                hint="start the job server there first (Beam's Flink or Spark job server: configs/flink-local.yaml "
                "and configs/spark-local.yaml say how), or name a running one with --job_endpoint HOST:PORT (the "
                "command line wins over a config file's pipeline_options); --job_endpoint embed runs Beam's own "
                "job server in this process",
            )
        raise ConfigError(
            f"Cannot reach the artifact service at --artifact_endpoint {endpoint}: {reason}",
            hint="start it there, or leave --artifact_endpoint out: the job server's own artifact service is used",
        )
