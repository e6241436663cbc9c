"""A worker's exception on a portable runner (Flink, Spark) reaches the user's one line: its type and message, with a
hint that fits it, from the runner's message (the SDK harness's Python traceback inside a Java exception) or from
the job's messages the job service streamed; and augment's ``--fn`` failing on a worker only (a module the workers
lack) or while its module is imported. configs/engines/test_flink.py runs the first on a cluster."""

from __future__ import annotations

import pytest

from tfrecord_etl.pipelines import common, errorlines, running
from tfrecord_etl.transforms.errors import ConfigError, RecordError

JOB = "BeamApp-root-1207-0001"


def harness_traceback(last: str, chained: str | None = None) -> str:
    """What Flink's job server reports for a bundle the SDK harness failed (the shape of a real message, Beam 2.50's
    Flink runner with a 2.77 harness): a Java exception holding the harness's Python traceback(s)."""
    frames = (
        '  File "/venv/lib/python3.11/site-packages/apache_beam/runners/worker/sdk_worker.py", line 310, in _execute\n'
        "    response = task()\n"
        "               ^^^^^^\n"
        '  File "apache_beam/runners/common.py", line 1512, in apache_beam.runners.common.DoFnRunner.process\n'
    )
    text = "java.lang.RuntimeException: Error received from SDK harness for instruction 1: "
    if chained:
        text += f"Traceback (most recent call last):\n{frames}{chained}\n\n"
        text += "During handling of the above exception, another exception occurred:\n\n"
    text += f"Traceback (most recent call last):\n{frames}{last}\n"
    return text + "\tat org.apache.beam.runners.fnexecution.control.FnApiControlClient$ResponseStreamObserver.onNext"


def failed(message: str, state: str = "FAILED") -> RuntimeError:
    return RuntimeError(f"Pipeline {JOB} failed in state {state}: {message}")


def test_a_module_the_workers_lack_is_named_with_where_to_install_it():
    text = harness_traceback("ModuleNotFoundError: No module named 'calibration' [while running 'Augment/Shard']")
    line = errorlines.runner_job_failed_line(failed(text))
    assert line == (
        f"OutputError: The runner's job {JOB} ended in state FAILED: a worker raised ModuleNotFoundError: No module "
        "named 'calibration' [while running 'Augment/Shard']; nothing was committed, so the output directory holds "
        f"what it held before. Hint: {errorlines.IMPORT_HINT}"
    )
    assert "restart strategy" not in line and "install it where the workers run" in line


def test_any_other_worker_exception_is_named_with_its_message_and_no_restart_hint():
    cause = "KeyError: 'x'"
    text = harness_traceback("ValueError: id 30 is past the calibration table", chained=cause)
    line = errorlines.runner_job_failed_line(failed(text))
    assert "a worker raised ValueError: id 30 is past the calibration table;" in line  # the last traceback's
    assert line.endswith(f"Hint: {errorlines.RAISED_HINT}") and "KeyError" not in line
    # a dotted exception class keeps its own name
    text = harness_traceback("google.protobuf.message.DecodeError: Error parsing message")
    assert "a worker raised DecodeError: Error parsing message;" in errorlines.runner_job_failed_line(failed(text))


def test_a_cut_off_message_takes_the_exception_from_the_jobs_messages():
    """Flink cuts the failure message of the job's state short; the job service's message stream has it whole."""
    e = failed(
        'java.lang.RuntimeException: Traceback (most recent call last):\n  File "sdk_worker.py", line 310, in _execute\n    respon'
    )
    setattr(
        e, errorlines.RUNNER_MESSAGES, ["Job state changed", harness_traceback("ImportError: cannot import name 'f'")]
    )
    line = errorlines.runner_job_failed_line(e)
    assert "a worker raised ImportError: cannot import name 'f';" in line and line.endswith(errorlines.IMPORT_HINT)


def test_a_cut_off_traceback_with_no_messages_says_so_and_where_to_look():
    line = errorlines.runner_job_failed_line(
        failed(
            'java.lang.RuntimeException: Traceback (most recent call last):\n  File "sdk_worker.py", line 310, in _e'
        )
    )
    assert line == (
        f"OutputError: The runner's job {JOB} ended in state FAILED: java.lang.RuntimeException: a worker raised an "
        "exception the runner's message cuts short; nothing was committed, so the output directory holds what it "
        f"held before. Hint: {errorlines.CUT_HINT}"
    )


def test_a_runner_failure_without_a_python_exception_keeps_the_restart_hint():
    line = errorlines.runner_job_failed_line(failed("java.net.ConnectException: Connection refused"))
    assert line.endswith(f"Hint: run again; {errorlines.RESTART_HINT}")
    assert (
        errorlines.worker_exception('Traceback (most recent call last):\n  File "x.py", line 1, in f\n    respon')
        is None
    )


def test_the_job_service_messages_are_kept_on_the_error(monkeypatch):
    """``running.run_pipeline`` keeps the streamed error messages of a PortableRunner result on the exception, and
    ``run_main`` prints the line from them: one line, exit 2."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_job_api_pb2

    full = harness_traceback("ModuleNotFoundError: No module named 'calibration'")

    class Result:
        _messages = (
            beam_job_api_pb2.JobMessagesResponse(
                message_response=beam_job_api_pb2.JobMessage(
                    message_text=full, importance=beam_job_api_pb2.JobMessage.JOB_MESSAGE_ERROR
                )
            ),
            beam_job_api_pb2.JobMessagesResponse(
                state_response=beam_job_api_pb2.JobStateEvent(state=beam_job_api_pb2.JobState.FAILED)
            ),
        )

        def wait_until_finish(self):
            raise failed("java.lang.RuntimeException: Traceback (most recent call last):\n  File")

    class Pipeline:  # Beam's Pipeline as run_pipeline uses it: options and run()
        options = PipelineOptions([])

        def run(self):
            return Result()

    def main(_argv):
        running.run_pipeline(Pipeline())
        return 0

    err = []
    monkeypatch.setattr(
        common.sys, "stderr", type("W", (), {"write": lambda self, s: err.append(s), "flush": lambda self: None})()
    )
    monkeypatch.setenv("TFRECORD_ETL_VERBOSE", "1")  # no runner log file for this fake run
    assert common.run_main(main, []) == 2
    text = "".join(err)
    assert text.count("error: ") == 1 and "Traceback" not in text, text
    assert "a worker raised ModuleNotFoundError: No module named 'calibration';" in text


def test_fn_importing_a_module_this_process_lacks_says_to_install_it_where_fn_runs(tmp_path, monkeypatch):
    from tfrecord_etl.transforms.augment import values

    fn = values.load_function("tests.augment_fns:calibrated")
    with pytest.raises(RecordError) as caught:
        values._call(fn, "tests.augment_fns:calibrated", {"id": 1}, "in.tfrecord", 0)
    assert "raised ModuleNotFoundError: No module named 'tfrecord_etl_calibration'" in str(caught.value)
    assert caught.value.hint == values.FN_IMPORT_HINT
    (tmp_path / "tfrecord_etl_calibration.py").write_text("SCALE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert values._call(fn, "f", {"id": 2}, "in.tfrecord", 0) == {"id_cal": 6}


def test_fn_module_raising_while_imported_is_one_config_error(tmp_path, monkeypatch):
    from tfrecord_etl.transforms.augment import values

    (tmp_path / "needs_a_licence.py").write_text("raise RuntimeError('no licence server configured')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"Importing the module of --fn needs_a_licence:f raised RuntimeError: no licence server configured",
    ):
        values.load_function("needs_a_licence:f")
