"""Runnable Beam pipelines: ``tfrecord-etl convert``.

Started as a command (the ``tfrecord-etl`` console script, ``python -m tfrecord_etl.pipelines.X``, or in a checkout
``pipelines.X`` run with ``python -m``), the process imports Beam before it does any work: some 2,600 modules, whose
objects the cyclic garbage collector would walk again and again while they load (about 0.3 s of the 1.2 s import on
a 2-core machine, measured). The collector is paused for those imports and resumed by ``common.run_main`` after
``gc.freeze()`` has moved what they made into the permanent generation, which later collections no longer walk (the
use the Python docs give for ``gc.freeze``; ``tfrecord_etl._startup``). Imported as a library, nothing changes.
"""
import sys as _sys

if _sys.argv[:1] == ["-m"]:  # `python -m` sets sys.argv[0] to "-m" while it imports the module's packages
    from tfrecord_etl._startup import pause_gc as _pause_gc
    _pause_gc()
