"""Runnable Beam pipelines: ``tfrecord-etl convert|augment|verify|inspect``.

This folder is the package ``tfrecord_etl.pipelines`` (setup.py's ``package_dir``), its only module name. Started as
a command (the ``tfrecord-etl`` console script, ``python -m tfrecord_etl.pipelines.X``, or in a checkout the alias
``pipelines.X`` run with ``python -m``), the process imports Beam before it does any work: some 2,600 modules,
whose objects the cyclic garbage collector would walk again and again while they load (about 0.3 s of the 1.2 s
import on a 2-core machine, measured). The collector is paused for those imports (:func:`pause_gc`) and resumed by
``common.run_main`` after ``gc.freeze()`` has moved what they made into the permanent generation, which later
collections no longer walk (the use the Python docs give for ``gc.freeze``; :func:`resume_gc`). Imported as a
library, nothing changes.
"""

import gc as _gc
import sys as _sys

_paused = [False]


def pause_gc() -> None:
    """Pauses the cyclic collector until :func:`resume_gc` (no-op if it is off already: the caller's choice)."""
    if not _paused[0] and _gc.isenabled():
        _paused[0] = True
        _gc.disable()


def resume_gc() -> None:
    """Ends a pause made by :func:`pause_gc`: everything alive now (the imported modules, mostly) moves to the
    permanent generation (``gc.freeze``), which later collections do not walk, and the collector runs again."""
    if _paused[0]:
        _paused[0] = False
        _gc.freeze()
        _gc.enable()


def _checkout_alias() -> None:
    """``pipelines.X`` run with ``python -m`` from a checkout's root imports this folder by its bare name
    ``pipelines``: it stands for ``tfrecord_etl.pipelines`` (this same file under its one name, which pauses the
    collector), so ``pipelines.X`` is found there and its ``__main__`` hands over to ``tfrecord_etl.pipelines.X``
    at once (``cli.run_command``). When that name leads to another checkout's folder (a venv's editable install made
    from another checkout), the command would mix two versions: it stops with one line instead. Any other
    import of the bare name is refused: it would load a second copy of every module."""
    # deferred: the package's namespace holds what it exports (and _gc, _sys); only this alias needs them
    import importlib
    import os

    if _sys.argv[:1] != ["-m"]:
        raise ImportError(
            "the commands' package is tfrecord_etl.pipelines: import tfrecord_etl.pipelines.X, not "
            "pipelines.X (one name per module; pipelines.X run with python -m from a checkout's root "
            "is the only alias)",
            name=__name__,
        )
    try:
        real = importlib.import_module("tfrecord_etl.pipelines")
    except ImportError as e:  # e.g. tfrecord_etl's own check of a checkout against the venv's install
        print(f"error: {e}", file=_sys.stderr)
        raise SystemExit(2) from None
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    there = os.path.realpath(list(real.__path__)[0])
    if here != there:
        print(
            f"error: pipelines.X run with python -m here would run {there}, another checkout's code (the one "
            f"this venv's editable install came from), not {here}. Hint: run configs/devlinks.sh in this checkout "
            f"once (docs/development.md, 'Several checkouts, one venv'), or use the tfrecord-etl command",
            file=_sys.stderr,
        )
        raise SystemExit(2)
    _sys.modules[__name__] = real


if __name__ == "pipelines":  # this folder imported by its bare name (see _checkout_alias)
    _checkout_alias()
elif _sys.argv[:1] == ["-m"]:  # `python -m` sets sys.argv[0] to "-m" while it imports the module's packages
    pause_gc()
