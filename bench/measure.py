"""Runs one command as a child process and measures it: wall time, CPU time, peak RSS of the process tree.

    python -m bench.measure --log run.log --json run.json [--timeout S] -- COMMAND ARGS...

This wrapper is itself started fresh for every contender, so its ``RUSAGE_CHILDREN`` accounting
covers exactly one run. Peak RSS is measured two ways:

* the kernel's high-water mark: ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` after every
  descendant has been reaped. It is the largest peak RSS of any single process of the tree (Linux
  folds each reaped child's own and children's maxima into its parent's). The wrapper makes itself
  a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so worker processes orphaned by their parent
  are reparented to it and reaped here, and still counted;
* psutil polling of the whole tree every ``--interval`` seconds: the peak of any one process (a lower
  bound; short spikes between samples are missed) and the peak of the tree's sum, plus the number of
  processes seen.

``peak_rss_bytes`` is the maximum of the two per-process figures; ``tree_rss_bytes`` is the polled sum.
Wall time runs from starting the command to its exit (descendants still alive then are given
``--grace`` seconds, then killed; their count is reported as ``stragglers``). The command's stdout
and stderr go to ``--log``; the result, as JSON, to ``--json``.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_all(block: bool) -> int:
    """Reaps exited descendants; returns how many. With ``block``, waits until none is left."""
    n = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return n
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            return n
        if pid == 0:
            return n
        n += 1


class _ProcTree:
    """The descendants of this process and their RSS, from /proc: the fallback when psutil is missing."""

    class Error(Exception):
        pass

    class Process:
        def __init__(self, pid: int):
            self.pid = pid

        def memory_info(self):
            try:
                with open(f"/proc/{self.pid}/statm", encoding="ascii") as f:
                    rss_pages = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                raise _ProcTree.Error(self.pid) from None
            return type("mem", (), {"rss": rss_pages * os.sysconf("SC_PAGE_SIZE")})()

        def kill(self):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                raise _ProcTree.Error(self.pid) from None

        def children(self, recursive=True):
            parents: dict[int, list[int]] = {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                parents.setdefault(ppid, []).append(int(entry))
            out, todo = [], [self.pid]
            while todo:
                for child in parents.get(todo.pop(), []):
                    out.append(_ProcTree.Process(child))
                    if recursive:
                        todo.append(child)
            return out


def measure(
    cmd: list[str],
    log_path: str,
    timeout: float | None,
    interval: float,
    grace: float,
    env: dict | None = None,
    cwd: str | None = None,
) -> dict:
    try:
        import psutil
    except ImportError:  # /proc gives the same, a little slower
        psutil = _ProcTree
    subreaper = _set_subreaper()
    me = psutil.Process(os.getpid())
    peak_proc = peak_tree = 0
    pids_seen: set[int] = set()
    timed_out = False

    def descendants():
        try:
            return me.children(recursive=True)
        except psutil.Error:
            return []

    with open(log_path, "wb") as log:
        started = time.perf_counter()
        child = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        deadline = started + timeout if timeout else None
        while True:
            total = 0
            for p in descendants():
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                pids_seen.add(p.pid)
                total += rss
                peak_proc = max(peak_proc, rss)
            peak_tree = max(peak_tree, total)
            try:
                code = child.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                pass
            if deadline and time.perf_counter() > deadline:
                timed_out = True
                try:
                    os.killpg(child.pid, signal.SIGKILL)  # the command's own session (start_new_session)
                except OSError:
                    pass
                _kill(descendants(), psutil)
                code = child.wait()
                break
        wall = time.perf_counter() - started
    # Descendants still alive (e.g. Beam workers not yet shut down): wait a little, then end them.
    end = time.perf_counter() + grace
    while time.perf_counter() < end:
        _reap_all(block=False)
        if not descendants():
            break
        time.sleep(0.05)
    left = descendants()
    _kill(left, psutil)
    _reap_all(block=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    maxrss = usage.ru_maxrss * 1024  # KiB on Linux
    return {
        "cmd": cmd,
        "returncode": code,
        "timed_out": timed_out,
        "wall_s": wall,
        "cpu_user_s": usage.ru_utime,
        "cpu_sys_s": usage.ru_stime,
        "peak_rss_bytes": max(maxrss, peak_proc),
        "kernel_maxrss_bytes": maxrss,
        "polled_peak_rss_bytes": peak_proc,
        "tree_rss_bytes": peak_tree,
        "procs_seen": len(pids_seen) or 1,
        "stragglers": len(left),
        "subreaper": subreaper,
        "psutil": psutil is not _ProcTree,
        "log": log_path,
    }


def _kill(procs, psutil) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m bench.measure --log LOG --json OUT [--timeout S] -- COMMAND...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m bench.measure")
    ap.add_argument("--log", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--grace", type=float, default=10.0)
    args = ap.parse_args(argv[:cut])
    result = measure(argv[cut + 1 :], args.log, args.timeout, args.interval, args.grace)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
