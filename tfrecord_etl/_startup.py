"""The garbage collector paused while a command imports Beam (see ``pipelines/__init__.py``). One module for the
state, whichever name the pipelines package was imported under (``pipelines`` when a checkout's
``pipelines.X`` runs with ``python -m``, ``tfrecord_etl.pipelines`` otherwise: two module objects of one file)."""
import gc

_paused = [False]


def pause_gc() -> None:
    """Pauses the cyclic collector until :func:`resume_gc` (no-op if it is off already: the caller's choice)."""
    if not _paused[0] and gc.isenabled():
        _paused[0] = True
        gc.disable()


def resume_gc() -> None:
    """Ends a pause made by :func:`pause_gc`: everything alive now (the imported modules, mostly) moves to the
    permanent generation (``gc.freeze``), which later collections do not walk, and the collector runs again."""
    if _paused[0]:
        _paused[0] = False
        gc.freeze()
        gc.enable()
