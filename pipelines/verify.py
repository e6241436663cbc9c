"""Verify TFRecord data: every frame and both masked CRC32Cs, record counts, decoding, and the source, exactly.

    tfrecord-etl verify TARGET [--source PATTERN ...] [--original DIR_OR_PATTERN ...] [--json] [--verbose]
        [--max_problems N] [--max_record_mb MB] [--max_features N] [--spans SPANS]

TARGET is an output directory of tfrecord-etl (metadata.json required: a directory without it is an
incomplete output and is refused), a sidecar collection of tfrecord-etl augment (its manifest.json is
checked too; its original shards only with --original: the paths written in manifest.json are never
opened), or a file / quoted glob of plain TFRecord files without metadata (each record must be a
tf.train.Example; the features are inferred). With --source, every array is compared with the convert
input exactly (planned writer: in row order; otherwise matched by the _source/file and _source/row
features of --provenance).

A collection directory (collection.json + span-N/): every span --spans selects (default all) is verified as an
output directory, and against its collection.json entry (metadata.json digest, record count, schema
fingerprint); with --source, each span is compared with the files its entry records as its inputs, among the
files the patterns match. Span directories not listed in collection.json are reported as uncommitted. One line
per span, then the total.

Exit code: 0 when everything holds; 1 when a problem was found (each reported with file, record index,
byte offset and feature); 2 when TARGET cannot be verified at all (bad flags, nothing matches, no or
invalid metadata.json, an exact comparison that this output cannot support).

Beam's pipeline flags (--runner, --labels, --project, ... : whatever Beam's PipelineOptions know) are accepted
and ignored, so that a Beam launcher such as Airflow's BeamRunPythonPipelineOperator can run this command like
the pipelines (it passes --flag=value only: TARGET may be given as --target); any other unknown flag is refused.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: hand over to tfrecord_etl.pipelines.verify, the module's one name
    from tfrecord_etl.pipelines.cli import run_command

    run_command("verify")

import argparse
import json
import sys

from tfrecord_etl.pipelines import common, flaghelp
from tfrecord_etl.transforms import verify as verify_lib
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import ConfigError, EtlError, printable
from tfrecord_etl.transforms.reading import collection_reader


class TqdmProgress(verify_lib.Progress):
    """A tqdm bar on stderr, shown only when stderr is a terminal and only after one second."""

    def __init__(self, enabled: bool):
        self._enabled, self._bar = enabled, None

    def start(self, label, total, unit="B"):
        self.close()
        if self._enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total or None,
                desc=label,
                unit=unit,
                unit_scale=True,
                unit_divisor=1024 if unit == "B" else 1000,
                delay=1.0,
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
            )

    def update(self, n):
        if self._bar is not None:
            self._bar.update(n)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def render(report: verify_lib.Report, verbose: bool = False) -> str:
    """The human report: one status line, then problems (file, record, byte offset, feature) and warnings."""
    if isinstance(report, verify_lib.CollectionReport):
        return render_collection(report, verbose)
    what = {"output": "output", "sidecar": "sidecar collection", "files": "TFRecord files"}[report.kind]
    checks = ["framing", "CRCs"]
    if report.kind == "files":
        checks.append("tf.train.Example payloads")
    else:
        checks += ["record counts", "decoding with the recorded features"]
    if report.schema:
        checks.append("schema.pbtxt against metadata.json")
    if report.checksums:
        checks.append(f"shard CRC32Cs ({report.checksums} of {len(report.files)})")
    if report.manifest:
        checks.append("manifest")
    if report.source:
        dead = report.source.get("dead_lettered")
        checks.append(
            f"exact values against the source ({report.source['compared']} of "
            f"{report.source['rows']} rows compared, {f'{dead} dead-lettered, ' if dead else ''}"
            f"{report.source['mode']})"
        )
    head = (
        f"{printable(report.target)}: {what}, {report.num_records} records in {len(report.files)} files, "
        f"compression {report.compression}"
    )
    lines = [f"{'OK' if report.ok else 'FAILED'}: {head}", f"checked: {', '.join(checks)} in {report.seconds:.1f} s"]
    if report.inferred and report.features:
        lines.append(
            "features (inferred): "
            + ", ".join(
                f"{printable(s.name)} {s.dtype} {list(s.shape) if s.shape is not None else '*'}"
                for s in report.features
            )
        )
    if verbose:
        for f in report.files:
            expected = "" if f.expected_records is None else f" (metadata: {f.expected_records})"
            cut = "" if f.complete else ", reading stopped at a problem"
            lines.append(f"  {printable(f.file)}: {f.records} records{expected}, {f.bytes} bytes, {f.compression}{cut}")
    if report.num_problems:
        lines.append(f"{report.num_problems} problem{'s' if report.num_problems != 1 else ''}:")
        lines += [f"  {p.describe()}" for p in report.problems]
        if report.num_problems > len(report.problems):
            lines.append(f"  ... {report.num_problems - len(report.problems)} more (raise --max_problems to list them)")
    for w in report.warnings:
        lines.append(f"warning: {printable(w)}")
    return "\n".join(lines)


def render_collection(report: verify_lib.CollectionReport, verbose: bool = False) -> str:
    """The human report of a collection: one line per span (its problems and warnings below it), the uncommitted
    span directories, then the total."""
    lines = []
    for span in report.spans:
        name = f"span {span.entry['span']}" + (
            f" version {span.entry['version']}" if span.entry["version"] is not None else ""
        )
        sub = span.report
        if sub is None:
            lines.append(f"{'OK' if span.ok else 'FAILED'}: {name}: not verified")
        else:
            checked = f", {sub.checksums} shard CRC32Cs" if sub.checksums else ""
            compared = f", {sub.source['compared']} rows compared with the source" if sub.source else ""
            lines.append(
                f"{'OK' if span.ok else 'FAILED'}: {name}: {sub.num_records} records in {len(sub.files)} "
                f"files{checked}{compared}"
            )
        problems = span.problems + (sub.problems if sub else [])
        lines += [f"  {p.describe()}" for p in problems]
        if sub is not None and sub.num_problems > len(sub.problems):
            lines.append(f"  ... {sub.num_problems - len(sub.problems)} more (raise --max_problems to list them)")
        if verbose and sub is not None:
            lines += [f"  {printable(f.file)}: {f.records} records, {f.bytes} bytes" for f in sub.files]
        lines += [f"  warning: {printable(w)}" for w in (sub.warnings if sub else [])]
    for rel in report.uncommitted:
        lines.append(
            f"uncommitted: {printable(rel)}: a span directory collection.json does not list (a run that "
            "has not committed yet, or crashed before it did); readers do not read it"
        )
    selected = (
        f"{len(report.spans)} of {report.num_spans} spans"
        if len(report.spans) != report.num_spans
        else f"{report.num_spans} spans"
    )
    lines.append(
        f"{'OK' if report.ok else 'FAILED'}: {printable(report.target)}: collection, {selected}, "
        f"{report.num_records} records, {report.num_problems} problem{'s' if report.num_problems != 1 else ''}"
        f" in {report.seconds:.1f} s"
    )
    return "\n".join(lines)


def build_parser() -> common.CommandParser:
    """The command's argument parser, its flags in the argument groups of ``flaghelp.GROUPS`` (``--help``, the
    docs' flag reference)."""
    parser = common.CommandParser(
        prog="tfrecord-etl verify",
        description=__doc__,
        ignore_beam_flags=True,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target", nargs="?", help="an output directory (with metadata.json), or a file or glob of TFRecord files"
    )
    parser.add_argument(
        "--target",
        dest="target_flag",
        metavar="TARGET",
        help="TARGET as a flag, for launchers that pass only --flag=value (default: the positional)",
    )
    parser.add_argument(
        "--source",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATTERN",
        help="file pattern(s) of the convert input: compare every array exactly (default: off)",
    )
    parser.add_argument(
        "--original",
        nargs="+",
        action="extend",
        default=[],
        metavar="DIR_OR_PATTERN",
        help="a sidecar's original collection (directory or file pattern): its shards, paired by "
        "file name with manifest.json, are checked (count, size, CRC32C); the manifest's own "
        "paths are never read (default: originals not checked)",
    )
    common.add_record_limit_flags(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON report instead of text (default: off)")
    parser.add_argument(
        "--max_problems", type=int, default=100, help="problems listed in the report; all are counted (default: 100)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="list every file, and show TensorFlow and Beam logs (default: off)"
    )
    parser.add_argument(
        "--spans",
        default=None,
        help="a collection's spans to verify: 7, 3,5,9, 3-9, latest, latest:N or all (default: all)",
    )
    return flaghelp.group_flags(parser, "verify")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    targets = {t for t in (args.target, args.target_flag) if t is not None}
    if len(targets) != 1:
        raise ConfigError(
            "TARGET is missing" if not targets else f"two TARGETs: {args.target!r} and --target {args.target_flag!r}",
            hint="give TARGET once, as the argument or as --target",
        )
    args.target = targets.pop()
    progress = TqdmProgress(enabled=not args.json and sys.stderr.isatty())
    try:
        max_record_bytes, max_features = common.record_limits(args)
        if collection.is_collection(args.target):
            if args.original:
                raise ConfigError(
                    "--original needs a sidecar collection: this is a collection directory",
                    file=args.target,
                    hint="verify one augmented span with --original COLL/span-N",
                )
            report = verify_lib.verify_collection(
                args.target,
                args.spans,
                args.source,
                progress,
                max(0, args.max_problems),
                max_record_bytes=max_record_bytes,
                max_features=max_features,
            )
        else:
            collection_reader.refuse_spans(args.target, args.spans)
            report = verify_lib.verify(
                args.target,
                args.source,
                progress,
                max(0, args.max_problems),
                originals=args.original,
                max_record_bytes=max_record_bytes,
                max_features=max_features,
            )
    except EtlError as e:
        if args.json:
            print(
                json.dumps(
                    {
                        "target": args.target,
                        "ok": False,
                        "error": {"type": type(e).__name__, "message": str(e), **e.context},
                    },
                    indent=1,
                    default=str,
                )
            )
        raise
    finally:
        progress.close()
    print(json.dumps(report.to_json(), indent=1, default=str) if args.json else render(report, args.verbose))
    return 0 if report.ok else 1
