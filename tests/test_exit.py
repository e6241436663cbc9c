"""``common.exit_process``: a command's process ends without CPython's teardown, but with its atexit handlers, its
buffered output and its exit status intact, and still joins threads that Python's own exit would join."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(body: str) -> subprocess.CompletedProcess:
    code = "from tfrecord_etl.pipelines import common\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_atexit_handlers_run_and_piped_output_is_flushed_with_the_exit_status(tmp_path):
    marker = tmp_path / "atexit.txt"
    done = _run(f"""
        import atexit, sys
        atexit.register(lambda: open({str(marker)!r}, "w").write("ran"))
        sys.stdout.write("x" * 100000)   # buffered: a pipe is not a terminal
        sys.stderr.write("last words")
        common.exit_process(3)
        print("not reached")
    """)
    assert done.returncode == 3
    assert done.stdout == "x" * 100000
    assert done.stderr == "last words"
    assert marker.read_text() == "ran"


def test_a_live_non_daemon_thread_is_joined_as_python_would(tmp_path):
    marker = tmp_path / "thread.txt"
    done = _run(f"""
        import threading, time
        def work():
            time.sleep(0.5)
            open({str(marker)!r}, "w").write("finished")
        threading.Thread(target=work).start()
        common.exit_process(0)
    """)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "finished"


def test_a_closed_stdout_does_not_change_the_exit_status():
    done = _run("""
        import os, sys
        sys.stdout.write("y" * 10)
        os.close(1)                     # the reader went away: the flush fails, the status stays
        common.exit_process(0)
    """)
    assert done.returncode == 0, done.stderr


def test_convert_as_a_process_prints_its_whole_summary_and_commits(tmp_path):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(10.0)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            str(src),
            "--output_dir",
            str(out),
            "--runner",
            "DirectRunner",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote 10 examples")
    assert "work span:" in done.stdout.splitlines()[-1]  # the last line, flushed before os._exit
    assert (out / "metadata.json").exists() and not (out / ".tf-etl.lock").exists()  # committed, unlocked
    from tfrecord_etl.transforms import reader

    assert np.array_equal(np.array([e["x"] for e in reader.iter_numpy(str(out))]), np.arange(10.0))
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            str(tmp_path / "none.h5"),
            "--output_dir",
            str(tmp_path / "o2"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")


def test_a_reader_that_goes_away_ends_the_command_with_one_line_not_a_traceback(tmp_path):
    """``convert ... | head -1``: stdout's pipe closes before the summary is printed."""
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(10.0)
    out = tmp_path / "out"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: every write to stdout fails with EPIPE
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.stdout.reconfigure(line_buffering=True); "
            "from tfrecord_etl.pipelines import common, convert; "
            "common.exit_process(common.run_main(convert.main, sys.argv[1:]))",
            "--input",
            str(src),
            "--output_dir",
            str(out),
            "--runner",
            "DirectRunner",
        ],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    os.close(write_end)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: the reader of standard output went away")
    assert (out / "metadata.json").exists()  # the work itself was committed before the summary


def test_a_job_the_runner_failed_is_one_line_not_a_traceback(capsys):
    """What PortableRunner raises when a Flink job fails with no restart left (seen with a TaskManager killed on a
    cluster whose restart strategy is none: configs/engines/test_flink.py)."""
    from tfrecord_etl.pipelines import common

    def main(argv):
        raise RuntimeError(
            "Pipeline BeamApp-root-1128-4f90_a458 failed in state FAILED: "
            "org.apache.flink.runtime.jobmaster.JobMasterException: TaskManager with id "
            "127.0.0.1:44727-52033f is no longer reachable.\n"
        )

    assert common.run_main(main, []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "error: OutputError: The runner's job BeamApp-root-1128-4f90_a458 ended in state FAILED: "
        "org.apache.flink.runtime.jobmaster.JobMasterException: TaskManager with id "
        "127.0.0.1:44727-52033f is no longer reachable; nothing was committed"
    ), err
