"""Lets TFX 1.21's native wheels that are tagged ``manylinux_2_39`` load on an older glibc (Debian 12: 2.36).

TensorFlow Data Validation 1.21 and ML Metadata 1.21 publish Linux wheels only as ``manylinux_2_39_x86_64``, built
with GCC 14. Their extensions need six symbols newer than Debian 12's glibc 2.36 and libstdc++ (GCC 12) have:
GLIBC_2.38's ``__isoc23_strtol``, ``__isoc23_strtoll``, ``__isoc23_strtoul`` and ``__isoc23_strtoull`` (glibc
2.38's C23 ``strtol`` family: the same as ``strtol`` except that base 0 and 2 also accept ``0b``), GLIBCXX_3.4.32's
``std::ios_base_library_init()`` (GCC 13's hook that makes sure the standard streams are constructed; older
libstdc++ constructs them through ``ios_base::Init`` objects) and CXXABI_1.3.15's ``__cxa_call_terminate`` (GCC 14's
landing pad for an exception leaving a ``noexcept`` function: catch it, ``std::terminate()``). This script, run by
``run_tfx_test.sh`` only when those extensions do not load:

  * ``python glibc_compat.py patch FILE.so...``: marks each of those version requirements of the file weak
    (``VER_FLG_WEAK`` in ``.gnu.version_r``, so the loader no longer refuses it) and makes the symbols that used them
    unversioned (``.gnu.version`` entries set to global), in place; prints what it changed;
  * ``python glibc_compat.py shim DIR``: builds ``libc23shim.so`` in DIR (g++) defining the six functions through
    the machine's ``strtol`` family, ``std::ios_base::Init`` and ``std::terminate``, and a ``tfx_glibc_compat.pth``
    line that loads it (``RTLD_GLOBAL``) when the venv's Python starts, before those extensions are imported.

Only the separate TFX venv is touched; the project's own environment never is. Plain ELF64 little-endian parsing
(the System V gABI's ``Elf64_Shdr`` and GNU's ``Elf64_Verneed`` / ``Elf64_Vernaux`` layouts).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

SHT_DYNSYM, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF
VER_FLG_WEAK, VER_NDX_GLOBAL = 0x2, 1
NEW_VERSIONS = (b"GLIBC_2.38", b"GLIBC_2.39", b"GLIBCXX_3.4.31", b"GLIBCXX_3.4.32", b"CXXABI_1.3.15")

SHIM_CC = r"""
#include <cstdlib>
#include <exception>
#include <ios>
extern "C" void *__cxa_begin_catch(void *) noexcept;
extern "C" {
/* GCC 14's landing pad for an exception leaving a noexcept function: catch it, then std::terminate. */
void __cxa_call_terminate(void *exception) noexcept {
  if (exception) __cxa_begin_catch(exception);
  std::terminate();
}
long __isoc23_strtol(const char *s, char **e, int b) { return std::strtol(s, e, b); }
long long __isoc23_strtoll(const char *s, char **e, int b) { return std::strtoll(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return std::strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return std::strtoull(s, e, b); }
}
namespace std {  // GCC 13's hook by which <iostream> users make sure the standard streams are set up
void ios_base_library_init() { static ios_base::Init init; }
}
"""


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def _cstr(data: bytes, offset: int) -> bytes:
    return data[offset : data.index(b"\0", offset)]


def patch(path: str) -> list[str]:
    """Weakens the GLIBC_2.38+ requirements of one ELF file in place; returns a line per change."""
    data = bytearray(open(path, "rb").read())
    sections = _sections(bytes(data))
    changes, weak_indexes = [], set()
    for sh in sections:
        if sh[1] != SHT_GNU_VERNEED:
            continue
        strtab = sections[sh[6]][4]  # sh_link: the string table's sh_offset
        pos = sh[4]
        for _ in range(sh[7]):  # sh_info: the Verneed entries
            _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            apos = pos + aux
            for _ in range(cnt):
                _, flags, other, name, anext = struct.unpack_from("<IHHII", data, apos)
                if _cstr(data, strtab + name) in NEW_VERSIONS:
                    struct.pack_into("<H", data, apos + 4, flags | VER_FLG_WEAK)
                    weak_indexes.add(other)
                    changes.append(f"{path}: {_cstr(data, strtab + name).decode()} requirement made weak")
                apos += anext
            if not nxt:
                break
            pos += nxt
    if weak_indexes:
        dynsym = next(sh for sh in sections if sh[1] == SHT_DYNSYM)
        dynstr = sections[dynsym[6]][4]
        versym = next(sh for sh in sections if sh[1] == SHT_GNU_VERSYM)
        for i in range(versym[5] // 2):
            off = versym[4] + 2 * i
            if struct.unpack_from("<H", data, off)[0] & 0x7FFF in weak_indexes:
                struct.pack_into("<H", data, off, VER_NDX_GLOBAL)
                name = _cstr(data, dynstr + struct.unpack_from("<I", data, dynsym[4] + 24 * i)[0]).decode()
                changes.append(f"{path}: symbol {name} unversioned")
        tmp = path + ".patching"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, os.stat(path).st_mode)
        os.replace(tmp, path)
    return changes


def shim(directory: str) -> str:
    """Builds ``libc23shim.so`` and the ``.pth`` that preloads it in ``directory`` (a site-packages)."""
    src, lib = os.path.join(directory, "libc23shim.cc"), os.path.join(directory, "libc23shim.so")
    with open(src, "w") as f:
        f.write(SHIM_CC)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    os.remove(src)
    with open(os.path.join(directory, "tfx_glibc_compat.pth"), "w") as f:
        f.write(f"import ctypes; ctypes.CDLL({lib!r}, mode=ctypes.RTLD_GLOBAL)\n")
    return lib


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("patch", "shim"):
        sys.exit("usage: glibc_compat.py patch FILE.so... | shim SITE_PACKAGES_DIR")
    if sys.argv[1] == "shim":
        print(shim(sys.argv[2]))
    else:
        for p in sys.argv[2:]:
            print("\n".join(patch(p)) or f"{p}: nothing to change")
