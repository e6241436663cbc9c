"""The launcher's hold on a cluster's job (pipelines/jobcontrol.py) without a cluster: its flag checked before
anything is written, the Flink REST address taken from --flink_master, what a job waiting for slots reports, and
the one line of a job server that stopped answering. The same on a real Flink cluster:
configs/engines/test_jobcontrol.py."""

from __future__ import annotations

import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrecord_etl.pipelines import errorlines, jobcontrol, running
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.output.runlock import OUTPUT_STATE


@pytest.mark.parametrize(
    "argv, url",
    [
        (["--flink_master=jm:8081"], "http://jm:8081"),
        (["--flink_master=https://jm.example:443/"], "https://jm.example:443"),
        (["--flink_master=[auto]"], None),
        ([], None),
    ],
)
def test_the_flink_rest_url_is_the_flink_master(argv, url):
    assert jobcontrol.flink_rest_url(PipelineOptions(argv)) == url


def test_the_slot_limit_is_refused_without_a_flink_master_or_above_zero():
    with pytest.raises(ConfigError, match=r"^--max_wait_for_slots_s needs --flink_master HOST:PORT"):
        jobcontrol.check(["--runner=PortableRunner", "--max_wait_for_slots_s=30"])
    with pytest.raises(ConfigError, match=r"^--max_wait_for_slots_s 0 is not above 0"):
        jobcontrol.check(["--flink_master=jm:8081", "--max_wait_for_slots_s=0"])
    jobcontrol.check(["--flink_master=jm:8081", "--max_wait_for_slots_s=30"])
    jobcontrol.check(["--runner=PortableRunner"])


class FakeRest(jobcontrol.FlinkRest):
    def __init__(self, pages):
        super().__init__("http://jm:8081")
        self.pages = pages

    def get(self, path):
        return self.pages.get(path)


def job(state, *vertices):
    return {"state": state, "vertices": [{"parallelism": p, "tasks": {"SCHEDULED": s}} for p, s in vertices]}


def test_a_job_waiting_for_more_slots_than_the_cluster_has_says_so():
    rest = FakeRest(
        {
            "/jobs/j1": job("RUNNING", (8, 8), (8, 8), (1, 0)),
            "/overview": {"taskmanagers": 2, "slots-total": 4, "slots-available": 0},
        }
    )
    wait = jobcontrol.slot_wait(rest, "j1")
    assert wait == jobcontrol.SlotWait("http://jm:8081", needed=8, total=4, free=0, taskmanagers=2)
    assert wait.describe() == (
        "the job needs 8 task slots, the cluster has 0 free of 4 on 2 TaskManagers (Flink at http://jm:8081)"
    )
    assert wait.hint() == "add TaskManagers or lower --parallelism to 4 or less"


def test_no_taskmanager_and_slots_held_by_other_jobs_have_their_own_hints():
    none = jobcontrol.SlotWait("http://jm:8081", needed=2, total=0, free=0, taskmanagers=0)
    assert none.describe() == "the job needs 2 task slots and the cluster has no TaskManager (Flink at http://jm:8081)"
    assert none.hint().startswith("start TaskManagers")
    busy = jobcontrol.SlotWait("http://jm:8081", needed=2, total=4, free=1, taskmanagers=2)
    assert busy.hint().startswith("other jobs hold the slots")


@pytest.mark.parametrize(
    "page, overview",
    [
        (job("RUNNING", (2, 0), (2, 0)), {"slots-available": 0}),  # every task has its slot
        (job("RUNNING", (2, 2)), {"slots-available": 2}),  # being deployed: the slots are free
        (job("CANCELED", (8, 8)), {"slots-available": 0}),  # over
        (None, None),  # the JobManager does not answer
    ],
)
def test_no_wait_is_reported_when_the_tasks_have_or_get_their_slots(page, overview):
    assert jobcontrol.slot_wait(FakeRest({"/jobs/j1": page, "/overview": overview}), "j1") is None


def test_the_flink_job_is_the_newest_one_named_after_the_beam_job():
    rest = FakeRest(
        {
            "/jobs/overview": {
                "jobs": [
                    {"jid": "old", "name": "BeamApp-u-1", "start-time": 1},
                    {"jid": "new", "name": "BeamApp-u-1", "start-time": 2},
                    {"jid": "other", "name": "BeamApp-u-2", "start-time": 3},
                ]
            }
        }
    )
    assert rest.find_job("BeamApp-u-1_5f0c-uuid") == "new"
    assert rest.find_job("BeamApp-u-3_uuid") is None


def test_a_lost_job_server_is_one_line_saying_what_the_directory_holds_and_what_became_of_the_job():
    lost = jobcontrol.JobServerLost("127.0.0.1:8099", "BeamApp-u-1_x", "UNAVAILABLE: Socket closed", "FATE")
    outer = RuntimeError("wrapped")
    outer.__cause__ = lost
    setattr(outer, OUTPUT_STATE, "previous")
    assert errorlines.job_server_lost_line(outer) == (
        "OutputError: The job server at --job_endpoint 127.0.0.1:8099 stopped answering while it ran job "
        "BeamApp-u-1_x (UNAVAILABLE: Socket closed); nothing was committed: the previous output is complete; FATE. "
        "Hint: restart the job server (or check the network to it) and run the command again"
    )
    assert errorlines.job_server_lost_line(RuntimeError("Pipeline x failed in state FAILED: y")) is None


class FakeResult:
    """A portable PipelineResult whose job server is gone."""

    _job_id = "BeamApp-u-1_uuid"

    class _job_service:  # the attribute Beam's result has
        @staticmethod
        def Cancel(request, timeout):  # gRPC's method name
            raise OSError("gone")


def test_without_the_flink_master_the_line_says_the_job_may_still_run_and_how_to_cancel_it():
    held = jobcontrol.Job(FakeResult(), PipelineOptions(["--job_endpoint=127.0.0.1:8099"]))
    assert held.cancel(job_server=False).startswith(
        "the job may still run on the cluster: cancel it there (Flink: flink cancel JOB_ID or the web UI; with "
        "--flink_master HOST:PORT the launcher cancels it itself"
    )


class Unavailable(grpc.RpcError):
    """What a job server's broken stream raises (grpc's _MultiThreadedRendezvous is one of these)."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "Stream removed (Socket closed)"


class Submitted:
    """A pipeline whose ``run`` returns a portable result that ``wait_until_finish`` ends with ``error``, and whose
    job server records the cancels it is asked for."""

    def __init__(self, error: BaseException):
        self.options = PipelineOptions(["--runner=PortableRunner", "--job_endpoint=127.0.0.1:8099"])
        self.cancels: list[str] = []
        pipeline = self

        class Result:
            _job_id = "BeamApp-u-1_uuid"

            class _job_service:  # the attribute Beam's result has
                @staticmethod
                def Cancel(request, timeout):  # gRPC's method name
                    pipeline.cancels.append(request.job_id)

            @staticmethod
            def wait_until_finish():
                raise error

        self.result = Result()

    def run(self):
        return self.result


def test_ctrl_c_cancels_the_job_and_says_so():
    p = Submitted(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as caught:
        running.run_pipeline(p)
    assert p.cancels == ["BeamApp-u-1_uuid"]
    assert getattr(caught.value, running.JOB_NOTE).startswith(
        "the job server at 127.0.0.1:8099 was asked to cancel it (Spark's job server stops the job; Flink's does "
        "not stop the Flink job: with --flink_master HOST:PORT"
    )


def test_a_broken_job_server_stream_is_a_lost_job_server():
    p = Submitted(Unavailable())
    with pytest.raises(jobcontrol.JobServerLost) as caught:
        running.run_pipeline(p)
    assert p.cancels == []  # nobody to ask: the job server is gone
    lost = caught.value
    assert (lost.endpoint, lost.job_id, lost.reason) == (
        "127.0.0.1:8099",
        "BeamApp-u-1_uuid",
        "UNAVAILABLE: Stream removed (Socket closed)",
    )
    assert lost.fate.startswith("the job may still run on the cluster")
