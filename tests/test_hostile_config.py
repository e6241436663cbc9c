"""Hostile configuration (groups 7, 12, 14, 16): misspelled flags, YAML bombs and duplicate keys, absurd numbers, blank
paths, and output file systems that are full or read-only. Each case ends in exit code 2 and one line
``error: ...`` on stderr (no traceback)."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.transforms import config as config_lib
from tfrecord_etl.transforms.errors import ConfigError

HINT_FLAGS = " Hint: see --help for our flags; Beam's are listed in its PipelineOptions"
HINT_KEYS = " Hint: see --help for every key, its type and default"


@pytest.fixture
def npy10(tmp_path) -> pathlib.Path:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10, dtype=np.int64))
    return path


def one_error_line(code, err) -> str:
    """The single ``error:`` line of a failed command (exit 2, no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def strip_runner_log(line: str) -> str:
    return line.split(" [runner log: ")[0]


# --- group 12: misspelled flags, YAML pipeline options, duplicate keys -------------------------------------


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--compresion", "gzip"], "unknown flag --compresion (did you mean --compression?)"),
        (["--datasetz", "/x"], "unknown flag --datasetz (did you mean --datasets?)"),
        (["--compresion=gzip"], "unknown flag --compresion (did you mean --compression?)"),
        (["--direct_num_worker", "2"], "unknown flag --direct_num_worker (did you mean --direct_num_workers?)"),
        (["--zzzqqq"], "unknown flag --zzzqqq"),
    ],
    ids=["compresion", "datasetz", "equals-form", "beam-flag-typo", "no-suggestion"],
)
def test_misspelled_convert_flag_is_refused(npy10, tmp_path, capsys, flags, expected):
    """Hostile group 12: a misspelled flag was passed to Beam, which dropped it (exit 0, option unset)."""
    code, _, err = convert(npy10, tmp_path / "out", *flags, capsys=capsys)
    assert one_error_line(code, err) == f"error: ConfigError: {expected}{HINT_FLAGS}"
    assert not (tmp_path / "out").exists()


def test_misspelled_augment_flag_is_refused(tmp_path, capsys):
    """Hostile group 12: augment takes the same check (its flags and Beam's)."""
    from tfrecord_etl.pipelines import augment

    code, _, err = run_command(
        augment.main,
        ["--input", str(tmp_path / "x*.tfrecord"), "--output_dir", str(tmp_path / "out"), "--overwrit", *BEAM_FLAGS],
        capsys,
    )
    assert (
        one_error_line(code, err) == f"error: ConfigError: unknown flag --overwrit (did you mean --overwrite?)"
        f"{HINT_FLAGS}"
    )


def test_misspelled_verify_flag_is_refused(tmp_path, capsys):
    """Hostile group 12: verify's and inspect's parsers refuse an unknown flag in one line, with a suggestion."""
    from tfrecord_etl.pipelines import inspect, verify

    code, _, err = run_command(verify.main, [str(tmp_path), "--sorce", "x.h5"], capsys)
    assert one_error_line(code, err) == (
        "error: ConfigError: unknown flag --sorce (did you mean --source?) "
        "Hint: tfrecord-etl verify --help lists every flag"
    )
    code, _, err = run_command(inspect.main, [str(tmp_path), "--tf-read"], capsys)
    assert one_error_line(code, err).startswith("error: ConfigError: unknown flag --tf-read (did you mean --tf_read?)")


def test_misspelled_yaml_pipeline_option_is_refused(npy10, tmp_path, capsys):
    """Hostile group 12: a misspelled key of the YAML ``pipeline_options`` mapping was dropped by Beam."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"input: {npy10}\npipeline_options:\n  runner: DirectRunner\n  direct_runing_mode: in_memory\n")
    code, _, err = run_command(
        __import__("tfrecord_etl.pipelines.convert", fromlist=["main"]).main,
        ["--config", cfg, "--output_dir", tmp_path / "out"],
        capsys,
    )
    assert one_error_line(code, err) == (
        f"error: ConfigError: unknown flag --direct_runing_mode (did you mean --direct_running_mode?){HINT_FLAGS}"
    )


def test_stray_positional_argument_is_refused(npy10, tmp_path, capsys):
    """Hostile group 12: an argument that belongs to no flag (e.g. an unquoted glob's second match) is refused."""
    code, _, err = convert(npy10, tmp_path / "out", "b.npy", capsys=capsys)
    assert one_error_line(code, err) == (
        "error: ConfigError: unexpected argument 'b.npy' Hint: every value "
        "belongs to a --flag; quote patterns with spaces"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--runner", "DirectRunner"],
        ["--runner=DirectRunner"],
        ["--direct_num_workers", "2"],
        ["--direct_running_mode", "multi_processing"],
        ["--direct_running_mode=in_memory"],
        ["--temp_location", "/tmp/x"],
        ["--s3_endpoint_url", "http://127.0.0.1:9"],
        ["--project", "p"],
        ["--flink_master", "localhost:8081"],
        ["--save_main_session"],
        ["--nosave_main_session"],
        ["--experiments", "a", "--experiments=b"],
        ["--region", "europe-west1", "--max_num_workers", "3"],
        ["--dask_client_address", "127.0.0.1:8786"],
        ["--environment_type", "LOOPBACK"],
        ["--s3_access_key_id=k", "--s3_secret_access_key", "s", "--s3_region_name", "us-east-1"],
    ],
    ids=lambda a: " ".join(a),
)
def test_real_beam_flags_are_accepted(argv):
    """Hostile group 12: the unknown-flag check keeps every real Beam flag (runners, S3, GCP, Flink, Dask)."""
    config_lib.check_beam_flags(argv)
    with pytest.raises(ConfigError, match=r"^unknown flag --runer \(did you mean --runner\?\)"):
        config_lib.check_beam_flags(argv + ["--runer", "DirectRunner"])


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--direct_num_workers", "abc"], "argument --direct_num_workers: invalid int value: 'abc'"),
        (
            ["--direct_running_mode", "bogus"],
            "argument --direct_running_mode: invalid choice: 'bogus' (choose from "
            "'in_memory', 'multi_threading', 'multi_processing')",
        ),
    ],
    ids=["int", "choice"],
)
def test_invalid_beam_flag_value_is_one_line(npy10, tmp_path, capsys, flags, expected):
    """Hostile group 12: a bad value of a Beam flag printed Beam's whole usage text and exited from inside Beam."""
    code, _, err = convert(npy10, tmp_path / "out", *flags, capsys=capsys, beam=False)
    assert one_error_line(code, err) == (
        f"error: ConfigError: Invalid Beam option: {expected} Hint: see Beam's PipelineOptions for its flags"
    )


def test_duplicate_yaml_key_is_refused(npy10, tmp_path, capsys):
    """Hostile group 12: a key repeated in the YAML config silently took the last value."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"input: {npy10}\ncompression: gzip\nnum_shards: 2\ncompression: none\n")
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(convert_module.main, ["--config", cfg, "--output_dir", tmp_path / "out"], capsys)
    assert one_error_line(code, err) == (
        f"error: ConfigError: Duplicate key 'compression' in the config file "
        f"(line 4, first on line 2) [file='{cfg}'] Hint: keep one of them"
    )


def test_duplicate_nested_yaml_key_is_refused(tmp_path):
    """Hostile group 12: a key repeated inside the ``pipeline_options`` mapping is refused too."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pipeline_options:\n  runner: DirectRunner\n  runner: DaskRunner\n")
    with pytest.raises(ConfigError, match=r"^Duplicate key 'runner' in the config file \(line 3, first on line 2\)"):
        config_lib.load_yaml(str(cfg))


# --- group 14: YAML bomb, oversized config, --num_shards ---------------------------------------------------

BILLION_LAUGHS = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_yaml_billion_laughs_is_refused(npy10, tmp_path, capsys):
    """Hostile group 14: a ~540-byte YAML of nested aliases expanded to billions of strings."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BILLION_LAUGHS)
    assert cfg.stat().st_size < 600
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(
        convert_module.main, ["--config", cfg, "--input", npy10, "--output_dir", tmp_path / "out"], capsys
    )
    assert one_error_line(code, err) == (
        f"error: ConfigError: YAML anchors and aliases (&a / *a) are not allowed "
        f"in config files (line 1) [file='{cfg}'] Hint: write the values out in full"
    )


def test_yaml_alias_alone_is_refused(tmp_path):
    """Hostile group 14: an alias (here a merge key) is refused even where the anchor is harmless."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("base: &base {compression: gzip}\npipeline_options:\n  <<: *base\n")
    with pytest.raises(ConfigError, match=r"^YAML anchors and aliases \(&base / \*base\) are not allowed"):
        config_lib.load_yaml(str(cfg))


def test_oversized_config_file_is_refused_before_parsing(tmp_path):
    """Hostile group 14: a config larger than the limit (1 MiB by default) is refused without parsing it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("# padding\n" * 20 + "compression: gzip\n")
    assert config_lib.load_yaml(str(cfg), max_bytes=4096) == {"compression": "gzip"}
    with pytest.raises(ConfigError, match=r"^The config file is larger than 100 bytes \[file="):
        config_lib.load_yaml(str(cfg), max_bytes=100)
    assert config_lib.MAX_CONFIG_BYTES == 1 << 20


def test_hundred_million_shards_are_refused(npy10, tmp_path, capsys):
    """Hostile group 14: --num_shards 100000000 on 10 rows planned 2 GB of empty shards (nothing after 90 s)."""
    code, _, err = convert(npy10, tmp_path / "out", "--num_shards", "100000000", capsys=capsys)
    assert one_error_line(code, err) == (
        "error: ConfigError: Invalid flags: 'num_shards': Input should be less "
        f"than or equal to 99999 (got 100000000){HINT_KEYS}"
    )


def test_more_shards_than_rows_are_refused(npy10, tmp_path, capsys):
    """Hostile group 14: at most one shard per row, checked at planning before the output is touched."""
    code, _, err = convert(npy10, tmp_path / "out", "--num_shards", "11", capsys=capsys)
    assert one_error_line(code, err) == (
        "error: ConfigError: --num_shards 11 is more than the 10 rows of the input "
        "(at most one shard per row) Hint: pass --num_shards 10 or fewer"
    )
    assert not (tmp_path / "out").exists()


def test_num_shards_limits_in_one_place():
    """Hostile group 14: sharding.check_num_shards holds the shard-count limits (rows and file-name digits)."""
    from tfrecord_etl.transforms.collections import sharding

    assert sharding.check_num_shards(10, 10) == 10
    assert sharding.check_num_shards(1, 0) == 1
    with pytest.raises(ConfigError, match=r"^--num_shards 2 is more than the 0 rows"):
        sharding.check_num_shards(2, 0)
    with pytest.raises(ConfigError, match=r"^--num_shards 100000 is more than 99999, the most the shard file names"):
        sharding.check_num_shards(100000, 10**9)
    assert (
        sharding.ShardPlan(99998, sharding.MAX_SHARDS, (), 0).file_name("data", ".tfrecord")
        == "data-99998-of-99999.tfrecord"
    )


def test_default_shard_count_is_capped_at_rows(npy10, tmp_path):
    """Hostile group 14: the default count (one shard per --target_shard_mb of data) never exceeds the rows."""
    from tfrecord_etl.pipelines import convert as convert_module

    cfg = config_lib.ConvertConfig(input=str(npy10), output_dir=str(tmp_path / "o"), target_shard_mb=1e-6)
    assert convert_module.build_plan(cfg).num_shards == 10


# --- group 16: absurd numbers, too many workers, full and read-only output, MemoryError --------------------


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--target_shard_mb", "inf", "Input should be a finite number (got inf)"),
        ("--target_range_mb", "inf", "Input should be a finite number (got inf)"),
        ("--target_range_mb", "nan", "Input should be a finite number (got nan)"),
        ("--target_shard_mb", "1e300", "Input should be less than or equal to 1048576 (got 1e+300)"),
        ("--target_range_mb", "1e9", "Input should be less than or equal to 65536 (got 1000000000.0)"),
    ],
    ids=["shard-inf", "range-inf", "range-nan", "shard-huge", "range-huge"],
)
def test_non_finite_or_huge_sizes_are_refused(npy10, tmp_path, capsys, flag, value, message):
    """Hostile group 16: --target_shard_mb inf / --target_range_mb inf ended in an OverflowError traceback."""
    code, _, err = convert(npy10, tmp_path / "out", flag, value, capsys=capsys)
    key = flag[2:]
    assert one_error_line(code, err) == f"error: ConfigError: Invalid flags: '{key}': {message}{HINT_KEYS}"


def test_too_many_local_workers_are_refused(npy10, tmp_path, capsys):
    """Hostile group 16: --direct_num_workers 100000 crashed; refused above --max_local_workers (4 per CPU, >= 16)."""
    limit = max(16, 4 * (os.cpu_count() or 1))
    code, _, err = convert(npy10, tmp_path / "out", "--direct_num_workers", "100000", capsys=capsys)
    assert one_error_line(code, err) == (
        f"error: ConfigError: --direct_num_workers 100000 is more than the limit of {limit} local workers "
        f"Hint: this machine has {os.cpu_count()} CPUs: use at most a few per CPU, or raise the limit with "
        f"--max_local_workers"
    )
    code, _, err = convert(
        npy10, tmp_path / "out2", "--direct_num_workers", "3", "--max_local_workers", "2", capsys=capsys
    )
    assert "is more than the limit of 2 local workers" in one_error_line(code, err)


@contextlib.contextmanager
def tiny_tmpfs(path: pathlib.Path, size: str = "64k"):
    """A tmpfs of ``size`` mounted at ``path`` (root only); skips the test when mounting is not allowed."""
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {e}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)


@pytest.fixture
def incompressible(tmp_path) -> pathlib.Path:
    path = tmp_path / "big.npy"
    np.save(path, np.random.default_rng(0).random((1000, 32)))  # 256 KB of random float64
    return path


@pytest.mark.timeout(300)
@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_disk_full_is_one_line(incompressible, tmp_path, capsys, writer):
    """Hostile group 16: disk full (ENOSPC) while writing shards ended in a traceback."""
    with tiny_tmpfs(tmp_path / "mnt") as mnt:
        out = mnt / "out"
        # gzip: with uncompressed shards the free-space check refuses the run before it starts
        code, _, err = convert(incompressible, out, "--writer", writer, "--compression", "gzip", capsys=capsys)
        assert strip_runner_log(one_error_line(code, err)) == (
            f"error: OutputError: No space left on device writing into --output_dir '{out}' (errno ENOSPC). "
            "Hint: free space on that file system or choose another --output_dir"
        )


@pytest.mark.timeout(300)
def test_disk_full_during_augment_is_one_line(incompressible, tmp_path, capsys):
    """Hostile group 16: disk full (ENOSPC) while augment writes its shards ended in a traceback."""
    from tfrecord_etl.pipelines import augment as augment_main

    assert convert(incompressible, tmp_path / "coll", capsys=capsys)[0] == 0
    with tiny_tmpfs(tmp_path / "mnt") as mnt:
        out = mnt / "out"
        code, _, err = run_command(
            augment_main.main,
            ["--input", tmp_path / "coll", "--output_dir", out, "--constants", "k=1", *BEAM_FLAGS],
            capsys,
        )
        line = strip_runner_log(one_error_line(code, err))
        assert line.startswith("error: OutputError: No space left on device writing ") and "(errno ENOSPC)" in line
        assert line.endswith("Hint: free space on that file system or choose another --output_dir"), line


@pytest.mark.timeout(300)
def test_read_only_output_file_system_is_one_line(incompressible, tmp_path, capsys):
    """Hostile group 16: a read-only output file system (EROFS) ended in a traceback."""
    with tiny_tmpfs(tmp_path / "mnt", "1m") as mnt:
        (mnt / "out").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True, timeout=30)
        code, _, err = convert(incompressible, mnt / "out", capsys=capsys)
        line = strip_runner_log(one_error_line(code, err))  # found before any work by outdir.prepare
        assert line == (
            f"error: ConfigError: The output directory is not writable (read-only file system or no "
            f"permission) [file='{mnt / 'out'}'] Hint: choose a writable --output_dir"
        ), line


def test_unwritable_output_directory_is_one_line(incompressible, tmp_path, capsys):
    """Hostile group 16: no permission to write into the output directory (EACCES) ended in a traceback."""
    if os.geteuid() == 0:
        pytest.skip("root ignores mode bits; the read-only tmpfs test and the EACCES text case cover root")
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        code, _, err = convert(incompressible, out, capsys=capsys)
    finally:
        out.chmod(0o755)
    line = strip_runner_log(one_error_line(code, err))
    assert line.startswith(f"error: OutputError: Permission denied writing '{out}/"), line
    assert line.endswith(
        "(errno EACCES). Hint: you may not write there: fix its permissions or choose another --output_dir"
    )


def test_output_oserror_raised_directly_is_one_line(npy10, tmp_path, capsys, monkeypatch):
    """Hostile group 16: an OSError of the output raised in the launcher itself (not in a worker), e.g. the
    output directory being a file (ENOTDIR), is one line naming the path."""
    from tfrecord_etl.transforms.output import outdir

    target = tmp_path / "file" / "out"

    def not_a_dir(*a, **k):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))

    monkeypatch.setattr(outdir, "prepare", not_a_dir)
    code, _, err = convert(npy10, target, capsys=capsys)
    assert one_error_line(code, err) == (
        f"error: OutputError: Not a directory writing '{target}' (errno ENOTDIR). "
        "Hint: a part of the path is a file, not a directory: choose another "
        "--output_dir"
    )


def test_memory_error_is_one_line(npy10, tmp_path, capsys, monkeypatch):
    """Hostile group 16: a MemoryError (e.g. an --fn returning 50 MB per record) ended in a traceback."""
    from tfrecord_etl.pipelines import convert as convert_module

    def out_of_memory(cfg, options=None, inputs=None):
        raise MemoryError()

    monkeypatch.setattr(convert_module, "build_plan", out_of_memory)
    code, _, err = convert(npy10, tmp_path / "out", capsys=capsys)
    assert one_error_line(code, err) == (
        "error: OutputError: Out of memory while reading, encoding or writing. "
        "Hint: pass a smaller --target_range_mb (rows read at once per worker) "
        "or fewer --direct_num_workers"
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            'Traceback (most recent call last):\n  File "w.py", line 3\nOSError: [Errno 28] No space left on device: '
            "'/data/out/.tmp-data-00001'\n",
            "OutputError: No space left on device writing '/data/out/.tmp-data-00001' "
            "(errno ENOSPC). Hint: free space on that file system or choose another "
            "--output_dir",
        ),
        (
            "PermissionError: [Errno 13] Permission denied: '/ro/x' [while running 'AugmentShards']",
            "OutputError: Permission denied writing '/ro/x' (errno EACCES). Hint: you may not write there: fix its "
            "permissions or choose another --output_dir",
        ),
        (
            "OSError: [Errno 122] Disk quota exceeded [while running 'WriteShards']",
            "OutputError: Disk quota exceeded writing into --output_dir 'o' (errno EDQUOT). Hint: free space within your "
            "quota or choose another --output_dir",
        ),
        (
            "Traceback...\nMemoryError\n",
            "OutputError: Out of memory while reading, encoding or writing. Hint: pass a "
            "smaller --target_range_mb (rows read at once per worker) or fewer "
            "--direct_num_workers",
        ),
        ("ValueError: something else", None),
    ],
    ids=["enospc", "eacces", "edquot", "memory", "other"],
)
def test_worker_output_errors_in_beam_text_are_one_line(text, expected):
    """Hostile group 16: Beam's multi-process runners re-raise a worker's OSError as text in a RuntimeError."""
    from tfrecord_etl.pipelines import errorlines

    assert errorlines.output_error_line(RuntimeError(text), "o") == expected


def test_worker_disk_full_through_run_main(tmp_path, capsys):
    """Hostile group 16: run_main turns a Beam-wrapped disk-full error (augment, beam writer) into one line."""
    from tfrecord_etl.pipelines import common

    def failing(argv):
        raise RuntimeError("OSError: [Errno 28] No space left on device [while running 'AugmentShards/Write']")

    code = common.run_main(failing, ["--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert strip_runner_log(one_error_line(code, err)) == (
        f"error: OutputError: No space left on device writing into --output_dir "
        f"'{tmp_path / 'o'}' (errno ENOSPC). Hint: free space on that file system "
        "or choose another --output_dir"
    )


# --- group 7: blank paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output_dir,message",
    [
        ("", "String should have at least 1 character (got '')"),
        ("   ", "Value error, must not be empty or blank (got '   ')"),
    ],
    ids=["empty", "blank"],
)
def test_blank_output_dir_is_refused(npy10, tmp_path, capsys, monkeypatch, output_dir, message):
    """Hostile group 7: --output_dir "" wrote the shards into the current directory."""
    monkeypatch.chdir(tmp_path)
    code, _, err = convert(npy10, output_dir, capsys=capsys)
    assert one_error_line(code, err) == f"error: ConfigError: Invalid flags: 'output_dir': {message}{HINT_KEYS}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy"]


def test_blank_input_is_refused(tmp_path, capsys):
    """Hostile group 7: a blank --input is refused in the config model, not matched as a pattern."""
    code, _, err = convert(" ", tmp_path / "out", capsys=capsys)
    assert one_error_line(code, err) == (
        f"error: ConfigError: Invalid flags: 'input': Value error, must not be empty or blank (got ' '){HINT_KEYS}"
    )
