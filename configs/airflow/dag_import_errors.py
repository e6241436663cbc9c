"""Prints why Airflow could not load DAG files: the import errors of Airflow's own DagBag.

    AIRFLOW_VENV/bin/python configs/airflow/dag_import_errors.py PATH [PATH ...]

Run with the python of an Airflow venv (Airflow 2 or 3). PATH is a DAG file or a dags folder. ``airflow dags test``
of a DAG whose file failed to import says only ``Dag '...' could not be found; either it does not exist or it failed
to parse``; this parses the files again as Airflow does (the same ``dagbag_import_timeout``, e.g. from
``AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT``) and prints each file's error: the traceback of an exception, or
``DagBag import timeout for FILE after Ns``. The test scripts of configs/airflow and configs/tfx call it when a DAG
does not load. Exits 1 when some file has an import error, 0 (printing the timeout and the DAGs found) when none.
"""

from __future__ import annotations

import os
import sys


def dagbag_class():
    """Airflow's DagBag class: ``airflow.dag_processing.dagbag`` in Airflow 3, ``airflow.models.dagbag`` in 2."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:
        from airflow.models.dagbag import DagBag
    return DagBag


def import_timeout() -> float:
    """Airflow's ``[core] dagbag_import_timeout`` in seconds, as this environment configures it."""
    from airflow.configuration import conf

    return conf.getfloat("core", "dagbag_import_timeout")


def import_errors(path: str) -> tuple[dict[str, str], list[str]]:
    """Parses the DAG file or folder ``path`` as Airflow does (examples left out). Returns ``({file: error}, dag
    ids)``: each error is the text Airflow records (a traceback, or its import-timeout message)."""
    bag = dagbag_class()(path, safe_mode=False)
    return dict(bag.import_errors), sorted(bag.dags)


def report(paths: list[str], out=sys.stderr) -> int:
    """Writes each import error of ``paths`` to ``out``, prefixed ``[dag-import-errors]``; returns 1 if there is
    one, else 0."""
    failed = 0
    timeout = import_timeout()
    for path in paths:
        errors, dags = import_errors(path)
        for file, error in errors.items():
            failed = 1
            print(f"[dag-import-errors] {file} does not import (dagbag_import_timeout {timeout:g} s):", file=out)
            print(error.rstrip(), file=out)
        if not errors:
            print(f"[dag-import-errors] {path}: no import error (DAGs {dags}, timeout {timeout:g} s)", file=out)
    return failed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "CRITICAL"  # Airflow's own log of the same errors: once is enough
    sys.exit(report(sys.argv[1:]))
