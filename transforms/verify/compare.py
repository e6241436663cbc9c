"""The comparison of an output with its convert source: the sources planned from the recorded options, the dead
letters recorded, and the comparer chosen (:func:`make_comparer`, in named steps)."""

from __future__ import annotations

from collections.abc import Sequence

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.renamed_flags import current_names  # options recorded under a flag's old name
from tfrecord_etl.transforms.verify.provenance import ProvenanceComparer
from tfrecord_etl.transforms.verify.report import PROVENANCE_FILE, PROVENANCE_ROW, Problem, Progress, Report
from tfrecord_etl.transforms.verify.sequential import SequentialComparer


def _same_spec(a: FeatureSpec, b: FeatureSpec) -> bool:
    return (a.name, a.dtype, a.shape) == (b.name, b.dtype, b.shape)


def plan_sources(meta: dict, patterns: Sequence[str], where: str = ""):
    """Plans ``patterns`` with the convert options recorded in ``meta["options"]``.

    Returns a list of ``transforms.planning.InputPlan``, one per pattern, in the order given.

    Raises:
      ConfigError: the metadata holds no convert options (not written by tfrecord-etl convert).
      SourceError, SchemaError: a pattern matches nothing or a source file cannot be indexed.
    """
    # deferred: pydantic and Beam (config): verify without --source, in the reader's install too, does without them
    from pydantic import ValidationError

    from tfrecord_etl.transforms.config import ConvertConfig

    opts = meta.get("options")
    if not isinstance(opts, dict) or not isinstance(opts.get("input"), str):
        raise ConfigError(
            "--source needs the convert options in metadata.json ('options.input' is missing): "
            "this output was not written by tfrecord-etl convert",
            file=where or None,
        )
    opts = {"categoricals": "codes", **opts}  # an output written before categoricals were mapped holds their codes
    try:  # the convert's own source options (planning.source_options is their one home)
        cfg = ConvertConfig.model_validate(
            {k: v for k, v in current_names(opts).items() if k in ConvertConfig.model_fields}
        )
        options = planning.source_options(cfg)
    except (TypeError, ValueError, ValidationError) as e:
        raise ConfigError(
            f"Invalid convert options in metadata.json: {str(e).splitlines()[0]}", file=where or None
        ) from None
    return [planning.plan_inputs(p, options) for p in patterns]


def dead_letters_of(meta: dict, where: str = "") -> list[dict] | None:
    """The row ranges metadata.json lists as dead-lettered (``dead_letters``, written by convert with
    ``--dead_letter_dir``), or None when it does not say which rows they were (an output written before the list
    was kept, or one whose list does not add up to ``rows_dead_lettered``).

    Raises:
      ConfigError: a ``dead_letters`` entry that is not ``{"file": str, "start": int, "stop": int, ...}`` with
        ``0 <= start < stop``.
    """
    letters = meta.get("dead_letters")
    dead = int(meta.get("rows_dead_lettered") or 0)
    if letters is None:
        return [] if not dead else None
    ok = isinstance(letters, list) and all(
        isinstance(d, dict)
        and isinstance(d.get("file"), str)
        and type(d.get("start")) is int
        and type(d.get("stop")) is int
        and 0 <= d["start"] < d["stop"]
        and isinstance(d.get("files") or [], list)
        and len(d.get("files") or ()) in (0, d["stop"] - d["start"])
        for d in letters
    )
    if not ok:
        raise ConfigError(
            "Invalid 'dead_letters' in metadata.json: expected a list of {file, start, stop} row ranges",
            file=where or None,
            hint="re-convert the output",
        )
    return letters if sum(d["stop"] - d["start"] for d in letters) == dead else None


def make_comparer(meta: dict, patterns: Sequence[str], report: Report, progress: Progress, where: str = ""):
    """The comparer for an output: sequential for the planned writer (skipping the rows metadata.json lists as
    dead-lettered), else matched by provenance. Returns None (with a problem) when the source's features differ.

    Steps: the way records pair with rows (:func:`choose_pairing`), the sources planned from the recorded options
    (:func:`plan_sources`, the planned writer's own ranges: :func:`as_written`), their features and rows against
    the output's (:func:`check_source_features`, :func:`check_source_rows`), the comparer built.

    Raises:
      ConfigError: exact comparison is impossible (records out of row order, or dead-lettered rows that the
        metadata does not list, and no provenance features), or the metadata holds no convert options.
    """
    specs = list(meta["features"])
    letters = dead_letters_of(meta, where)
    sequential = choose_pairing(meta, letters, where)
    plans = as_written(meta, plan_sources(meta, patterns, where))
    if not check_source_features(report, specs, patterns, plans):
        return None
    dead = int(meta.get("rows_dead_lettered") or 0)
    check_source_rows(report, meta, plans, dead)
    same_paths = list(patterns) == [meta["options"].get("input")]
    lossy = tuple(meta["options"].get("allow_lossy") or ())
    if sequential:
        return SequentialComparer(plans, specs, lossy, report, same_paths, letters)
    return ProvenanceComparer(plans, specs, lossy, report, same_paths, dead, progress, letters)


def choose_pairing(meta: dict, letters: list[dict] | None, where: str) -> bool:
    """Step 1: True when records follow the source's rows in order (the planned writer, its dead-lettered rows
    listed, one split), so they are compared sequentially; else they are paired by provenance.

    Raises:
      ConfigError: not in row order and the output has no provenance features.
    """
    names = {s.name for s in meta["features"]}
    has_provenance = {PROVENANCE_FILE, PROVENANCE_ROW} <= names
    dead = int(meta.get("rows_dead_lettered") or 0)
    split = len(meta.get("splits") or {}) > 1 or len(meta.get("runs") or ()) > 1
    sequential = meta.get("writer") == "planned" and letters is not None and not split
    if not sequential and not has_provenance:
        why = (
            f"{dead} rows were dead-lettered and metadata.json does not list them"
            if letters is None
            else "the rows are spread over splits"
            if split
            else f"the records are not in source row order (writer {meta.get('writer')!r})"
        )
        raise ConfigError(
            f"Exact comparison with the source needs the {PROVENANCE_FILE} and {PROVENANCE_ROW} "
            f"features: {why} and the output has no provenance",
            file=where or None,
            hint=("re-convert (with --dead_letter_dir, metadata.json lists the rows) or with --provenance")
            if letters is None
            else "re-convert with --provenance" + ("" if split else ", or with the planned writer (--writer planned)"),
        )
    return sequential


def as_written(meta: dict, plans: list) -> list:
    """Step 2: for the planned writer over one source, the writer's own row ranges (shards are cut at chunk-aligned
    byte boundaries, then split into ranges): its dead letters are whole ranges, so unreadable rows must be counted
    by the same ranges. Otherwise ``plans`` as they are."""
    num_shards = len(meta.get("shards") or ())
    if meta.get("writer") == "planned" and len(plans) == 1 and num_shards:
        return [plans[0].as_written(num_shards)]
    return plans


def check_source_features(report: Report, specs: list, patterns: Sequence[str], plans: list) -> bool:
    """Step 3: each source's features against the output's (provenance features aside); a ``source`` problem and
    False for the first that differs."""
    data_specs = [s for s in specs if s.name not in (PROVENANCE_FILE, PROVENANCE_ROW)]
    for pattern, plan in zip(patterns, plans):
        if len(plan.specs) != len(data_specs) or not all(_same_spec(a, b) for a, b in zip(plan.specs, data_specs)):
            have = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in plan.specs)
            want = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in data_specs)
            report.add(
                Problem(
                    "source",
                    f"The source's features ({have}) differ from the output's ({want}): not compared",
                    file=pattern,
                )
            )
            return False
    return True


def check_source_rows(report: Report, meta: dict, plans: list, dead: int) -> None:
    """Step 4: the source's rows against the output's records plus its dead-lettered rows (a ``source`` problem)."""
    total = sum(p.num_rows for p in plans)
    expected = int(meta.get("num_records") or 0) + dead
    if total != expected:
        report.add(
            Problem(
                "source",
                f"The source holds {total} rows, the output {meta.get('num_records')} records "
                f"and {dead} dead-lettered rows",
            )
        )
