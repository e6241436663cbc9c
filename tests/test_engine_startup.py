"""How the engines stage starts a Flink cluster's JobManager (configs/engines/engines.py): a JobManager that exits
before its REST API answers is started once more with fresh ports, and the error names its log's first error line
(a JVM's log ends in the stack of the failure's last consequence; its cause is logged first). Seen once in CI: the
JobManager's ResourceManager failed as the loaded machine started it (exit 239) and the message held only the end
of a stack trace. No Flink needed: a script plays the JobManager."""

from __future__ import annotations

import subprocess
import sys

import pytest

from configs.engines import engines
from configs.engines.engines import EngineError, FlinkCluster, Proc

# the fake jobmanager.sh: fails the first ``FAILS`` times (an ERROR line, 200 lines of stack, exit 239), then serves
# Flink's /overview on the rest.port of $FLINK_CONF_DIR/flink-conf.yaml
FAKE_JOBMANAGER = r"""#!/usr/bin/env bash
count_file="$FLINK_CONF_DIR/../starts"
n=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 )); echo $n > "$count_file"
if [ "$n" -le "$FAILS" ]; then
  echo "INFO starting"
  echo "ERROR Fatal error occurred in the cluster entrypoint: the root cause $n"
  for i in $(seq 200); do echo "	at akka.actor.ActorCell.invoke(ActorCell.scala:$i)"; done
  exit 239
fi
port=$(sed -n 's/^rest.port: //p' "$FLINK_CONF_DIR/flink-conf.yaml")
exec "$PYTHON" -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{\"taskmanagers\": 0}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
' "$port"
"""


@pytest.fixture
def fake_flink(tmp_path, monkeypatch):
    home = tmp_path / "flink"
    (home / "bin").mkdir(parents=True)
    (home / "conf").mkdir()
    for name in ("log4j.properties", "log4j-console.properties"):
        (home / "conf" / name).write_text("")
    (home / "bin" / "jobmanager.sh").write_text(FAKE_JOBMANAGER)
    monkeypatch.setattr(engines, "FLINK_HOME", home)
    monkeypatch.setenv("PYTHON", sys.executable)
    return home


def _cluster(tmp_path) -> FlinkCluster:
    return FlinkCluster(tmp_path / "work", taskmanagers=0)


def test_a_jobmanager_that_exits_as_it_starts_is_started_again_with_fresh_ports(
    fake_flink, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FAILS", "1")
    cluster = _cluster(tmp_path)
    try:
        cluster._start_jobmanager()
        assert engines.http_json(f"{cluster.rest_url}/overview") == {"taskmanagers": 0}
    finally:
        cluster.procs.stop_all()
    assert (cluster.workdir / "starts").read_text().strip() == "2"
    # the first attempt's log kept beside the second's, and its cause printed
    assert "the root cause 1" in (cluster.workdir / "logs" / "jobmanager-attempt1.log").read_text()
    err = capsys.readouterr().err
    assert "[flink] the JobManager did not start (attempt 1 of 2)" in err
    assert "exited with 239" in err and "the root cause 1" in err


def test_a_jobmanager_that_exits_every_time_fails_with_its_first_error(fake_flink, tmp_path, monkeypatch):
    monkeypatch.setenv("FAILS", "5")
    cluster = _cluster(tmp_path)
    with pytest.raises(
        EngineError, match=r"jobmanager exited with 239 while waiting for the JobManager's REST API"
    ) as e:
        try:
            cluster._start_jobmanager()
        finally:
            cluster.procs.stop_all()
    # the cause (line 2 of a 202-line log) is in the message although only the last 40 lines are
    assert "(first error, line 2:)" in str(e.value)
    assert "ERROR Fatal error occurred in the cluster entrypoint: the root cause 2" in str(e.value)
    assert "ActorCell.scala:200" in str(e.value) and "ActorCell.scala:100)" not in str(e.value)
    assert (cluster.workdir / "starts").read_text().strip() == "2"


def test_log_tail_shows_the_first_error_only_when_the_tail_does_not(tmp_path):
    log = tmp_path / "x.log"
    proc = Proc("x", ["x"], subprocess.Popen(["true"]), log)
    proc.popen.wait()
    log.write_text("".join(f"line {i}\n" for i in range(10)) + "ERROR late\n")
    assert proc.log_tail(n=5) == "\n".join(["line 6", "line 7", "line 8", "line 9", "ERROR late"])
    log.write_text("ERROR early\n" + "".join(f"line {i}\n" for i in range(10)))
    assert proc.log_tail(n=3, first_error=2).splitlines() == [
        "(first error, line 1:)",
        "ERROR early",
        "line 0",
        "(... last 3 lines:)",
        "line 7",
        "line 8",
        "line 9",
    ]
    assert Proc("y", ["y"], proc.popen, tmp_path / "missing.log").log_tail() == "(no log)"
