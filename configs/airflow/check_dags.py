"""Runs the tfrecord-etl DAGs with ``airflow dags test`` and checks what they wrote (called by run_airflow_test.sh).

    python configs/airflow/check_dags.py --airflow .venv-airflow/bin/airflow --work DIR [--only manual,daily,...]

Runs with the project's python (numpy, h5py, TensorFlow and this project); ``airflow`` is the Airflow venv's
command, with ``AIRFLOW_HOME`` and the dags folder already set up by the shell script. Stages:

- ``manual``: ``tfrecord_etl`` on one HDF5 file (convert -> augment with a join -> verify);
- ``daily``: ``tfrecord_etl_daily`` for three logical dates, each day's files under ``raw/YYYY-MM-DD/``, and one
  date again; the re-run must rewrite the same shard bytes and leave every other span's files untouched; what the
  scheduler sees (timetable, max_active_runs, the runs of a backfill's ``--dry-run``);
- ``incremental``: ``tfrecord_etl_incremental`` over ``incoming/*.h5`` holding the first three days' files, then
  with a fourth day's files added, then with nothing new (which must leave the tree as it was, mtimes included);
- then both collections read back exactly, with our reader and with plain TensorFlow, against the generated
  arrays.
Exits 1 with the failing run's task log on the first problem.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import h5py
import numpy as np

DAYS = ["2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"]  # the daily DAG runs the first three
RERUN_DAY = 1  # the day whose daily run is repeated
TASKS = ("convert", "augment", "verify")
BEAM = {"direct_running_mode": "multi_processing", "direct_num_workers": 2}  # the manual DAG's run
TIMINGS: list[tuple[str, float]] = []
HERE = os.path.dirname(os.path.abspath(__file__))


def say(message: str) -> None:
    print(f"[airflow-test] {message}", file=sys.stderr, flush=True)


def fail(message: str, log: str | None = None) -> None:
    if log:
        lines = log.splitlines()
        picked = [ln for ln in lines if re.search(r"Running command|ERROR|error:|Traceback|Error", ln)]
        print("\n".join(picked[-40:] + ["----"] + lines[-40:]), file=sys.stderr)
    say(f"FAILED: {message}")
    sys.exit(1)


def span_number(day: str) -> int:
    """Days since 1970-01-01: TFX's span of a date (and convert's, and the DAG's ``span_number`` macro)."""
    return (dt.date.fromisoformat(day) - dt.date(1970, 1, 1)).days


# ------------------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------------------


def day_arrays(i: int, part: str) -> dict[str, np.ndarray]:
    """The arrays of file ``part`` (a or b) of day ``i``: ids unique over all days, big-endian floats."""
    rows = {"a": 40 + 7 * i, "b": 25 + 3 * i}[part]
    ids = np.arange(rows, dtype="<i8") + 10_000 * i + (0 if part == "a" else 1000)
    return {"id": ids, "x": np.stack([ids, ids / 2, -ids], axis=1).astype(">f4"), "label": (ids % 11 - 5).astype("<i4")}


def expected(days: list[int]) -> dict[str, np.ndarray]:
    """The rows of ``days`` in order (a span's files are read in path order: a.h5, then b.h5)."""
    parts = [day_arrays(i, p) for i in days for p in "ab"]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def write_day(i: int, folder: str, prefix: str = "") -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for part in "ab":
        path = os.path.join(folder, f"{prefix}{part}.h5")
        with h5py.File(path, "w") as f:
            for name, values in day_arrays(i, part).items():
                f.create_dataset(name, data=values, chunks=(16,) + values.shape[1:])
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------------------------------
# Airflow
# ------------------------------------------------------------------------------------------------------------


class Airflow:
    def __init__(self, command: str, work: str):
        self.command, self.work, self.count = command, work, 0

    def cli(self, *args: str) -> str:
        done = subprocess.run([self.command, *args], capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"airflow {' '.join(args)} exited {done.returncode}", done.stdout + done.stderr)
        return done.stdout

    def json_cli(self, *args: str):
        lines = [ln for ln in self.cli(*args, "-o", "json").splitlines() if ln.startswith("[")]
        return json.loads(lines[-1]) if lines else []

    def dags_test(self, dag_id: str, logical_date: str, what: str, conf: dict) -> str:
        """``airflow dags test DAG_ID LOGICAL_DATE --conf CONF``; fails unless the run and its three tasks
        succeeded. Returns the run's log (the tasks' output included)."""
        self.count += 1
        log_path = os.path.join(self.work, f"dags-test-{self.count}-{dag_id}.log")
        say(f"airflow dags test {dag_id} {logical_date}: {what}")
        started = time.monotonic()
        env = dict(os.environ, AIRFLOW__LOGGING__LOGGING_LEVEL="INFO")
        with open(log_path, "w") as out:
            code = subprocess.run(
                [self.command, "dags", "test", dag_id, logical_date, "--conf", json.dumps(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            ).returncode
        seconds = time.monotonic() - started
        TIMINGS.append((f"{dag_id} {logical_date} ({what})", seconds))
        log = open(log_path).read()
        runs = self.json_cli("dags", "list-runs", dag_id)
        when = dt.datetime.fromisoformat(logical_date)
        run = next(
            (r for r in runs if r.get("logical_date") and dt.datetime.fromisoformat(r["logical_date"]) == when), None
        )
        states = {}
        if run is not None:
            states = {
                t["task_id"]: t["state"] for t in self.json_cli("tasks", "states-for-dag-run", dag_id, run["run_id"])
            }
        if code != 0 or run is None or run["state"] != "success" or any(states.get(t) != "success" for t in TASKS):
            if "could not be found" in log:  # Airflow's whole message when the DAG's file did not import: say why
                python = os.path.join(os.path.dirname(self.command), "python")
                helper = os.path.join(HERE, "dag_import_errors.py")
                subprocess.run([python, helper, os.environ["AIRFLOW__CORE__DAGS_FOLDER"]])
            fail(
                f"airflow dags test {dag_id} {logical_date} exited {code}; run: {run}; task states: {states} "
                f"(log: {log_path})",
                log,
            )
        for line in re.findall(r"Running command: (.*)", log):
            say(f"  ran: {line[:300]}")
        say(f"  ok in {seconds:.0f} s")
        return log


# ------------------------------------------------------------------------------------------------------------
# What is on disk
# ------------------------------------------------------------------------------------------------------------


def snapshot(root: str) -> dict[str, tuple]:
    """Every file and folder under ``root``: relative path -> (sha256, size, mtime_ns) or ("dir",)."""
    tree = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            tree[os.path.relpath(os.path.join(folder, d), root)] = ("dir",)
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            st = os.stat(path)
            tree[os.path.relpath(path, root)] = (digest, st.st_size, st.st_mtime_ns)
    return tree


def differences(before: dict, after: dict) -> list[str]:
    return [
        f"{p}: {before.get(p)} -> {after.get(p)}"
        for p in sorted(set(before) | set(after))
        if before.get(p) != after.get(p)
    ]


def is_shard(path: str) -> bool:
    return bool(re.search(r"\.tfrecord(\.gz)?$", path))


def check_rerun(before: dict, after: dict, span_dir: str) -> None:
    """The re-run of one day: its span's shards have the same bytes (a replacing run names them with a new
    generation, ``data-gN-...``: compared by shard, generation left out), and nothing outside its span changed
    except the collection files (which record the run)."""

    def shards(tree: dict) -> dict[str, str]:
        return {
            re.sub(r"-g\d+-", "-", p): v[0]
            for p, v in tree.items()
            if p.split(os.sep)[1:2] == [span_dir] and is_shard(p)
        }

    def outside(tree: dict) -> dict:
        return {
            p: v for p, v in tree.items() if p.split(os.sep)[1:2] != [span_dir] and not p.endswith("collection.json")
        }

    old, new = shards(before), shards(after)
    if not old or old != new:
        fail(f"re-running a day changed the shards of {span_dir}:\n  " + "\n  ".join(differences(old, new)))
    changed = differences(outside(before), outside(after))
    if changed:
        fail("re-running a day changed files outside its span:\n  " + "\n  ".join(changed))
    say(
        f"  re-run: {len(new)} shards of {span_dir} byte-identical, {len(outside(before))} other paths untouched "
        f"(sha256 and mtime)"
    )


def check_collection(coll_dir: str, spans: list[int], inputs: list[list[str]] | None, rows: list[int]) -> None:
    """collection.json lists ``spans`` with ``rows`` records each and, given ``inputs``, these input files."""
    coll = json.load(open(os.path.join(coll_dir, "collection.json")))
    got = [
        (s["span"], s["num_records"], sorted(i["path"] for i in s["inputs"]) if inputs else None) for s in coll["spans"]
    ]
    want = [(s, n, sorted(i) if inputs else None) for s, n, i in zip(spans, rows, inputs or [None] * len(spans))]
    if got != want:
        fail(f"{coll_dir}/collection.json lists {got}, expected {want}")
    say(f"  {coll_dir}/collection.json: spans {spans}, records {rows}")


def check_reads(coll_dir: str, spans: list[int], span_days: list[list[int]], augmented: bool) -> None:
    """Every span read back exactly: all spans with our reader, one span alone, each span with plain TF."""
    from tfrecord_etl.pipelines.common import preload_tensorflow
    from tfrecord_etl.transforms import reader

    preload_tensorflow()  # without TensorFlow's start-up lines on stderr
    want_all = expected([d for days in span_days for d in days])
    rows = list(reader.iter_numpy(coll_dir))
    compare(f"iter_numpy({coll_dir})", rows, want_all, augmented)
    one = list(reader.iter_numpy(coll_dir, spans=spans[-1]))
    compare(f"iter_numpy({coll_dir}, spans={spans[-1]})", one, expected(span_days[-1]), augmented)
    for span, days in zip(spans, span_days):
        compare_tf(os.path.join(coll_dir, f"span-{span}"), expected(days), augmented)
    say(f"  {coll_dir}: {len(rows)} records of {len(spans)} spans exact (our reader and plain TensorFlow)")


def compare(what: str, rows: list[dict], want: dict, augmented: bool) -> None:
    got = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in want}
    for k, values in want.items():
        if got[k].shape != values.shape or not np.array_equal(got[k], values):
            fail(f"{what}: feature {k} differs: {got[k].shape} {got[k][:3]} vs {values.shape} {values[:3]}")
    if augmented and {bytes(np.asarray(r["etl_source"]).reshape(-1)[0]) for r in rows} != {b"airflow"}:
        fail(f"{what}: the augmented feature etl_source is not b'airflow' in every record")


def compare_tf(span_dir: str, want: dict, augmented: bool) -> None:
    """A span's shards read with plain TensorFlow (tf.data, tf.io.parse_example), in shard-name order."""
    import tensorflow as tf  # preloaded quietly by check_reads

    shards = sorted(f for f in glob.glob(os.path.join(span_dir, "*")) if is_shard(f))
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "x": tf.io.FixedLenFeature([3], tf.float32),
    }
    if augmented:
        spec["etl_source"] = tf.io.FixedLenFeature([], tf.string)
    ds = (
        tf.data.TFRecordDataset(shards, compression_type="GZIP")
        .batch(10_000)
        .map(lambda b: tf.io.parse_example(b, spec))
    )
    parsed = {k: np.concatenate([batch[k].numpy() for batch in ds]) for k in spec}
    for k in ("id", "label", "x"):
        if not np.array_equal(parsed[k], want[k]):
            fail(f"plain TensorFlow on {span_dir}: feature {k} differs from the generated arrays")
    if augmented and set(parsed["etl_source"].tolist()) != {b"airflow"}:
        fail(f"plain TensorFlow on {span_dir}: etl_source is not b'airflow' everywhere")


def verified(log: str, target: str, records: int) -> None:
    if not re.search(rf"OK: {re.escape(target)}\b.*\b{records} records", log):
        fail(f"no verify report 'OK: {target} ... {records} records' in the task log", log)


# ------------------------------------------------------------------------------------------------------------
# Stages
# ------------------------------------------------------------------------------------------------------------


def conf(work: str, name: str, input_pattern: str, **more) -> dict:
    return {
        "input": input_pattern,
        "output_dir": f"{work}/collections/{name}",
        "augmented_dir": f"{work}/collections/{name}-augmented",
        "runner": "DirectRunner",
        "beam_options": {},  # convert's default --direct_running_mode auto
        "convert_options": {"compression": "gzip", "num_shards": 2},
        "augment_options": {"constants": "etl_source=airflow"},
        **more,
    }


def manual(af: Airflow, work: str, root: str) -> None:
    """The manual DAG on one file, with a join of labels: the outputs read back."""
    from tfrecord_etl.transforms import reader

    ids = np.arange(500, dtype="<i8")
    os.makedirs(f"{work}/data", exist_ok=True)
    with h5py.File(f"{work}/data/in.h5", "w") as f:
        f.create_dataset("id", data=ids, chunks=(100,))
        f.create_dataset(
            "x", data=np.stack([ids, ids / 2, -ids], axis=1).astype(">f4"), chunks=(100, 3), compression="gzip"
        )
    np.save(f"{work}/data/labels.npy", (ids * 10).astype("<i4"))
    log = af.dags_test(
        "tfrecord_etl",
        "2026-11-25T00:00:00+00:00",
        "one file, a join",
        conf(
            work,
            "manual",
            f"{work}/data/in.h5",
            beam_options=BEAM,
            convert_options={"compression": "gzip", "num_shards": 2, "config": f"{root}/configs/local.yaml"},
            augment_options={
                "join_input": f"{work}/data/labels.npy",
                "join_fields": "array=label",
                "constants": "etl_source=airflow",
            },
        ),
    )
    aug = list(reader.iter_numpy(f"{work}/collections/manual-augmented"))
    if [int(e["id"]) for e in aug] != list(range(500)) or [int(e["label"]) for e in aug] != list(range(0, 5000, 10)):
        fail("tfrecord_etl: the augmented output does not read back as written")
    if not re.search(
        rf"wrote 500 examples in 2 shards, \d+ bytes \(gzip[^)]*\) to {re.escape(work)}/collections/manual\b", log
    ):
        fail("tfrecord_etl: no convert summary in the task log", log)
    verified(log, f"{work}/collections/manual-augmented", 500)
    say("  tfrecord_etl: 500 records converted, joined, verified")


def schedule(af: Airflow) -> None:
    """What the scheduler sees of the daily DAG: its timetable, max_active_runs, and the runs a backfill of
    three days creates (a dry run: one run per data interval, its logical date the interval's start)."""
    details = af.json_cli("dags", "details", "tfrecord_etl_daily")[0]
    if details["timetable_summary"] != "0 0 * * *" or str(details["max_active_runs"]) != "1":
        fail(
            f"tfrecord_etl_daily: timetable {details['timetable_summary']!r}, max_active_runs "
            f"{details['max_active_runs']!r}; expected '0 0 * * *' and 1"
        )
    days = ["2026-11-02", "2026-11-03", "2026-11-04"]  # days without runs of this test
    plan = af.cli(
        "backfill",
        "create",
        "--dag-id",
        "tfrecord_etl_daily",
        "--from-date",
        days[0],
        "--to-date",
        days[-1],
        "--dry-run",
    )
    dates = re.findall(r"(\d{4}-\d\d-\d\d) 00:00:00\+00:00", plan.split("Runs to be attempted")[-1])
    if dates != days:
        fail(f"airflow backfill create --dry-run of {days[0]}..{days[-1]} plans runs {dates}", plan)
    say(f"  tfrecord_etl_daily: '0 0 * * *', max_active_runs 1; a backfill of {days[0]}..{days[-1]} plans {dates}")


def day_after(day: str) -> str:
    """The logical date of a manual run whose data interval is ``day``: midnight after it (the daily DAG's
    ``CronDataIntervalTimetable`` takes the last complete interval before the logical date)."""
    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat() + "T00:00:00+00:00"


def daily(af: Airflow, work: str) -> None:
    inputs = [write_day(i, f"{work}/raw/{day}") for i, day in enumerate(DAYS[:3])]
    run_conf = conf(work, "daily", f"{work}/raw/{{YYYY}}-{{MM}}-{{DD}}/*.h5")
    for i, day in enumerate(DAYS[:3]):  # the run after day D holds the data interval [D, D+1)
        log = af.dags_test("tfrecord_etl_daily", day_after(day), f"data interval starting {day}", run_conf)
        verified(log, f"{work}/collections/daily-augmented", len(expected([i])["id"]))
    schedule(af)
    spans = [span_number(d) for d in DAYS[:3]]
    before = snapshot(work + "/collections")
    day = DAYS[RERUN_DAY]
    af.dags_test("tfrecord_etl_daily", day_after(day), f"{day} again", run_conf)
    check_rerun(before, snapshot(work + "/collections"), f"span-{span_number(day)}")
    rows = [len(expected([i])["id"]) for i in range(3)]
    check_collection(f"{work}/collections/daily", spans, inputs, rows)
    check_collection(f"{work}/collections/daily-augmented", spans, None, rows)
    check_reads(f"{work}/collections/daily", spans, [[0], [1], [2]], augmented=False)
    check_reads(f"{work}/collections/daily-augmented", spans, [[0], [1], [2]], augmented=True)


def incremental(af: Airflow, work: str) -> None:
    incoming = f"{work}/incoming"
    first = [p for i, day in enumerate(DAYS[:3]) for p in write_day(i, incoming, f"{day}-")]
    run_conf = conf(work, "incremental", f"{incoming}/*.h5")
    log = af.dags_test("tfrecord_etl_incremental", "2026-11-22T01:00:00+00:00", "three days' files", run_conf)
    verified(log, f"{work}/collections/incremental-augmented", len(expected([0, 1, 2])["id"]))
    before = snapshot(work + "/collections")
    fourth = write_day(3, incoming, f"{DAYS[3]}-")
    log = af.dags_test("tfrecord_etl_incremental", "2026-11-22T02:00:00+00:00", "a fourth day's files", run_conf)
    verified(log, f"{work}/collections/incremental-augmented", len(expected([3])["id"]))
    after = snapshot(work + "/collections")
    changed = list(
        differences(
            {p: v for p, v in before.items() if p.split(os.sep)[1:2] == ["span-0"]},
            {p: v for p, v in after.items() if p.split(os.sep)[1:2] == ["span-0"]},
        )
    )
    if changed:
        fail("the run with new files changed span 0:\n  " + "\n  ".join(changed))
    log = af.dags_test("tfrecord_etl_incremental", "2026-11-22T03:00:00+00:00", "nothing new", run_conf)
    if "nothing new" not in log:
        fail("the run without new files did not say 'nothing new'", log)
    same = differences(after, snapshot(work + "/collections"))
    if same:
        fail("the run without new files wrote:\n  " + "\n  ".join(same))
    say(f"  nothing new: {len(after)} paths unchanged (bytes and mtimes)")
    rows = [len(expected([0, 1, 2])["id"]), len(expected([3])["id"])]
    check_collection(f"{work}/collections/incremental", [0, 1], [first, fourth], rows)
    check_reads(f"{work}/collections/incremental", [0, 1], [[0, 1, 2], [3]], augmented=False)
    check_reads(f"{work}/collections/incremental-augmented", [0, 1], [[0, 1, 2], [3]], augmented=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--airflow", required=True, help="the airflow command of Airflow's venv")
    parser.add_argument("--work", required=True, help="an empty work folder (AIRFLOW_HOME may be inside)")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    parser.add_argument("--only", default="manual,daily,incremental", help="stages to run (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, args.root)  # this checkout's tfrecord_etl, wherever .venv installed it from
    af = Airflow(args.airflow, args.work)
    stages = {
        "manual": lambda: manual(af, args.work, args.root),
        "daily": lambda: daily(af, args.work),
        "incremental": lambda: incremental(af, args.work),
    }
    for name in args.only.split(","):
        stages[name]()
    for what, seconds in TIMINGS:
        say(f"timing: {seconds:5.1f} s  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
