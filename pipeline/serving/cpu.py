"""Does this CPU run the installed llama.cpp build? Checked before the server starts.

A llama.cpp build runs the instructions it was compiled for and no others; a CPU lacking
one of them stops the server with SIGILL, and a build compiled for the machine that built
it (``GGML_NATIVE=ON``) takes that machine's extensions, AVX-512 and AMX among them, to
every machine it is copied to. ``scripts/install`` builds portably (``GGML_NATIVE=OFF``:
on x86-64 SSE4.2, AVX, AVX2, BMI2, FMA and F16C, nothing newer).

What a build needs is asked of the build itself: ggml's CPU library answers
``ggml_cpu_has_avx2()`` and its like from its compile-time settings. The library is loaded
in a child process, so a build whose very loading needs a missing instruction fails there,
not in refine. What the CPU has comes from ``/proc/cpuinfo``. The check runs on x86-64
Linux, where builds differ in what they need; an arm64 build without ``GGML_NATIVE`` uses
the base instruction set every arm64 CPU has.

This module uses the standard library only and imports nothing from refine:
``scripts/smoke_server.py`` loads it by path on machines without refine installed.
"""

from __future__ import annotations

import json
import platform
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PORTABLE",
    "X86_FLAGS",
    "Build",
    "cpu_flags",
    "crash_advice",
    "describe",
    "exit_name",
    "find_cpu_library",
    "fix",
    "is_x86_64",
    "missing",
    "probe_build",
    "read_cpu_flags",
    "refusal",
]

# ggml's name for each x86 feature it reports (``ggml_cpu_has_NAME``) and the flag
# /proc/cpuinfo lists for it (SSE3 is "pni" there, for Prescott New Instructions).
X86_FLAGS: Mapping[str, str] = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "avx": "avx",
    "avx2": "avx2",
    "bmi2": "bmi2",
    "f16c": "f16c",
    "fma": "fma",
    "avx_vnni": "avx_vnni",
    "avx512": "avx512f",
    "avx512_vbmi": "avx512vbmi",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_int8": "amx_int8",
}

PORTABLE = frozenset({"sse3", "ssse3", "avx", "avx2", "bmi2", "f16c", "fma"})
"""What the portable x86-64 build (``scripts/install local``) is compiled for."""

# The CMake option that turns each portable feature off, for a CPU that lacks it.
_OPTION: Mapping[str, str] = {
    "sse3": "GGML_SSE42",
    "ssse3": "GGML_SSE42",
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "bmi2": "GGML_BMI2",
    "f16c": "GGML_F16C",
    "fma": "GGML_FMA",
}
_INSTALL = "scripts/install local"
_PORTABLE_WORDS = "AVX2, FMA, F16C and BMI2; no AVX-512, no AMX"
_OLDER = "-DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"
_AFTER = (
    " Or set REFINE_LLAMA_SERVER to a llama-server built for this CPU. If it still fails, "
    "report it with this message, the server's log and the output of: "
    "python3 scripts/smoke_server.py --describe --bin {folder}"
)
# The CPU library's names: a wheel carries only the versioned file (the package restores
# the plain name's link when imported, which a folder copied out of a wheel lacks).
_LIBRARIES = ("libggml-cpu.so", "libggml-cpu.so.*", "libggml-cpu.dylib", "libggml-cpu.*.dylib")

# Run in a child: loads the CPU library and prints the features it was compiled for.
_PROBE = """
import ctypes, json, sys
library = ctypes.CDLL(sys.argv[1])
names = [n for n in sys.argv[2:] if hasattr(library, "ggml_cpu_has_" + n)]
print(json.dumps([n for n in names if getattr(library, "ggml_cpu_has_" + n)()]))
"""


@dataclass(frozen=True, slots=True)
class Build:
    """What the probe learnt of a llama.cpp build's CPU library."""

    library: Path
    features: frozenset[str] | None
    """ggml's names of the x86 features it was compiled for; None when the probe failed."""
    failure: str = ""
    """Why the probe failed (the library could not be loaded, or died loading)."""


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU's feature flags from the text of ``/proc/cpuinfo`` (its first ``flags`` line)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This machine's CPU flags; None where there is no ``/proc/cpuinfo`` to read."""
    try:
        flags = cpu_flags(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return flags or None


def is_x86_64() -> bool:
    """Whether this machine runs x86-64 code (where builds differ in the features they use)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def find_cpu_library(binary: Path) -> Path | None:
    """ggml's CPU library beside ``binary`` (the package's layout) or in ``../lib``."""
    folder = binary.resolve().parent
    for place in (folder, folder.parent / "lib"):
        for pattern in _LIBRARIES:
            found = sorted(place.glob(pattern))
            if found:
                return found[0]
    return None


def probe_build(library: Path, timeout: float = 60.0) -> Build:
    """Ask ggml's CPU library which x86 features it was compiled for, in a child process."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _PROBE, str(library), *X86_FLAGS],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Build(library, None, f"could not run the probe: {err}")
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        return Build(library, None, ": ".join([exit_name(done.returncode), *said]))
    try:
        names = json.loads(done.stdout)
    except ValueError:
        return Build(library, None, f"unexpected probe output {done.stdout[:200]!r}")
    return Build(library, frozenset(str(name) for name in names))


def missing(build: Iterable[str], cpu: frozenset[str]) -> tuple[str, ...]:
    """The features the build needs that the CPU lacks, in ggml's names, sorted."""
    return tuple(sorted(name for name in build if X86_FLAGS.get(name, name) not in cpu))


def fix(lacking: Iterable[str], build: frozenset[str] | None) -> str:
    """The rebuild that runs here: without ``lacking``, the portable one, or one with less."""
    lacking = set(lacking)
    if lacking and lacking <= PORTABLE:
        options = " ".join(sorted({f"-D{_OPTION[name]}=OFF" for name in lacking}))
        return f'rebuild it without them, from a refine checkout: CMAKE_ARGS="{options}" {_INSTALL}'
    if build is None or lacking or build - PORTABLE:
        return f"rebuild the portable server ({_PORTABLE_WORDS}) from a refine checkout: {_INSTALL}"
    return (
        f"this is the portable build ({_PORTABLE_WORDS}); for a CPU that lacks those, from a "
        f'refine checkout: CMAKE_ARGS="{_OLDER}" {_INSTALL}'
    )


def refusal(binary: Path, build: Build, cpu: frozenset[str]) -> str | None:
    """Why the build cannot run on this CPU (naming the fix), or None when it can."""
    if build.features is None:
        if not build.failure.startswith("SIGILL"):
            return None  # not known: the server's own start tells
        return (
            f"the llama.cpp server at {binary} cannot run on this CPU: loading its CPU "
            f"library {build.library} stopped on an illegal instruction (SIGILL). To fix "
            f"it, {fix((), None)}.{_AFTER.format(folder=binary.parent)}"
        )
    lacking = missing(build.features, cpu)
    if not lacking:
        return None
    return (
        f"the llama.cpp server at {binary} was built for CPU features this CPU lacks: "
        f"{', '.join(lacking)} (it uses {', '.join(sorted(build.features))}). To fix it, "
        f"{fix(lacking, build.features)}.{_AFTER.format(folder=binary.parent)}"
    )


def crash_advice(returncode: int, binary: Path, build: Build | None) -> str:
    """What to do when the server died of a signal while starting ("" for other exits)."""
    if returncode not in (-signal.SIGILL, -signal.SIGSEGV, -signal.SIGBUS):
        return ""
    features = build.features if build is not None else None
    if returncode == -signal.SIGILL:
        what = "stopped on an illegal instruction (SIGILL): it uses a CPU feature this CPU lacks"
    elif features is not None and "amx_int8" in features:
        what = (
            f"crashed ({exit_name(returncode)}); it was built with AMX (GGML_NATIVE=ON on a "
            "machine with AMX), whose code crashes on some machines"
        )
    else:
        what = f"crashed ({exit_name(returncode)}) loading the model or computing its first tokens"
    built = f", built for {' '.join(sorted(features))}," if features else ""
    return f"The server at {binary}{built} {what}. To fix it, {fix((), features)}." + _AFTER.format(
        folder=binary.parent
    )


def describe(binary: Path) -> str:
    """Lines for a report: the machine, its CPU's features, the build and what it needs."""
    cpu = read_cpu_flags()
    lines = [f"machine: {platform.machine()} {platform.system()} {platform.release()}"]
    lines.append(f"cpu: {_cpu_model()}")
    if cpu is not None:
        known = sorted(flag for flag in cpu if flag in X86_FLAGS.values() or "amx" in flag)
        lines.append(f"cpu features: {' '.join(known) or '(none of those builds use)'}")
    lines.append(f"server: {binary}")
    info = binary.resolve().parent.parent / "build_info.json"
    if info.is_file():
        lines.append(f"build info: {' '.join(info.read_text(encoding='utf-8').split())}")
    library = find_cpu_library(binary)
    if library is None:
        lines.append("build features: unknown (no libggml-cpu beside the server)")
        return "\n".join(lines)
    build = probe_build(library)
    if build.features is None:
        lines.append(f"build features: unknown ({build.failure})")
    else:
        lines.append(f"build features: {' '.join(sorted(build.features))}")
        if cpu is not None and is_x86_64():
            lacking = missing(build.features, cpu)
            lines.append(f"this cpu lacks: {' '.join(lacking) or 'nothing the build uses'}")
    return "\n".join(lines)


def exit_name(returncode: int) -> str:
    """``SIGILL`` for -4, ``exit code 3`` for 3: how a process ended, in words."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return platform.processor() or "unknown"
