"""The CPU check: what a build needs, what this CPU has, and the fix each message names."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.serving.binary import check_cpu
from pipeline.serving.cpu import (
    PORTABLE,
    Build,
    cpu_flags,
    crash_advice,
    find_cpu_library,
    fix,
    missing,
    probe_build,
    refusal,
)

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path("/opt/llama/bin/llama-server")
HASWELL = frozenset(["fpu", "sse2", "pni", "ssse3", "sse4_2", "avx", "avx2", "bmi2", "f16c", "fma"])
SANDY_BRIDGE = frozenset(["fpu", "sse2", "pni", "ssse3", "sse4_2", "avx"])
NATIVE_AVX512 = PORTABLE | {"avx512", "avx512_vnni", "avx_vnni"}
NATIVE_AMX = NATIVE_AVX512 | {"amx_int8"}


def test_cpu_flags_come_from_the_first_flags_line() -> None:
    """/proc/cpuinfo's flags line is read whole, once; a text without one has no flags."""
    text = "processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t: x\nprocessor\t: 1\nflags\t: fpu\n"
    assert cpu_flags(text) == {"fpu", "avx2", "fma"}
    assert cpu_flags("processor\t: 0\nmodel name\t: Arm\n") == frozenset()


@pytest.mark.parametrize(
    ("build", "cpu", "lacking"),
    [
        (PORTABLE, HASWELL, ()),
        (PORTABLE, SANDY_BRIDGE, ("avx2", "bmi2", "f16c", "fma")),
        (NATIVE_AVX512, HASWELL, ("avx512", "avx512_vnni", "avx_vnni")),
        (frozenset({"sse3"}), frozenset({"pni"}), ()),  # SSE3 is "pni" in /proc/cpuinfo
        (frozenset({"sse3"}), frozenset({"sse3"}), ("sse3",)),
    ],
)
def test_missing_features(
    build: frozenset[str], cpu: frozenset[str], lacking: tuple[str, ...]
) -> None:
    """The features a build uses that the CPU lacks, matched by the CPU's own flag names."""
    assert missing(build, cpu) == lacking


@pytest.mark.parametrize(
    ("lacking", "build", "command"),
    [
        (
            ("avx2", "fma"),
            PORTABLE,
            'CMAKE_ARGS="-DGGML_AVX2=OFF -DGGML_FMA=OFF" scripts/install local',
        ),
        (("avx512",), NATIVE_AVX512, "portable server (AVX2, FMA, F16C and BMI2; no AVX-512"),
        ((), NATIVE_AMX, "portable server"),
        ((), None, "portable server"),
        (
            (),
            PORTABLE,
            'CMAKE_ARGS="-DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"',
        ),
    ],
)
def test_fix_names_the_build_that_runs_here(
    lacking: tuple[str, ...], build: frozenset[str] | None, command: str
) -> None:
    """Portable features lacking: a build without them; a build beyond the portable set or
    unknown: the portable one; the portable build failing anyway: one without AVX2 and co."""
    assert command in fix(lacking, build)


def test_refusal_names_what_is_lacking_and_the_fix() -> None:
    """A portable build on a CPU without AVX2: the message names the features and the rebuild."""
    build = Build(Path("/opt/llama/bin/libggml-cpu.so"), PORTABLE)
    message = refusal(SERVER, build, SANDY_BRIDGE)
    assert message is not None
    assert "this CPU lacks: avx2, bmi2, f16c, fma" in message
    assert (
        'CMAKE_ARGS="-DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_F16C=OFF -DGGML_FMA=OFF" '
        "scripts/install local" in message
    )
    assert "scripts/smoke_server.py --describe --bin /opt/llama/bin" in message
    assert refusal(SERVER, build, HASWELL) is None


def test_refusal_of_a_build_for_another_machine_asks_for_the_portable_one() -> None:
    """A native AVX-512 build copied to a CPU without it: reinstall the portable build."""
    build = Build(Path("libggml-cpu.so"), NATIVE_AVX512)
    message = refusal(SERVER, build, HASWELL)
    assert message is not None
    assert "lacks: avx512, avx512_vnni, avx_vnni" in message
    assert "rebuild the portable server" in message and "scripts/install local" in message


def test_refusal_when_the_probe_fails() -> None:
    """A library that cannot be probed passes (the start tells), unless it died of SIGILL."""
    unknown = Build(Path("libggml-cpu.so"), None, "exit code 1: OSError: cannot open")
    assert refusal(SERVER, unknown, HASWELL) is None
    died = Build(Path("libggml-cpu.so"), None, "SIGILL")
    message = refusal(SERVER, died, HASWELL)
    assert message is not None and "illegal instruction (SIGILL)" in message


@pytest.mark.parametrize(
    ("returncode", "build", "says"),
    [
        (-signal.SIGILL, PORTABLE, "illegal instruction (SIGILL)"),
        (-signal.SIGSEGV, NATIVE_AMX, "built with AMX (GGML_NATIVE=ON"),
        (-signal.SIGSEGV, PORTABLE, "this is the portable build"),
        (-signal.SIGBUS, None, "crashed (SIGBUS)"),
    ],
)
def test_crash_advice(returncode: int, build: frozenset[str] | None, says: str) -> None:
    """A server dead of a signal gets advice for its build; the way to report is named."""
    advice = crash_advice(returncode, SERVER, Build(Path("lib"), build))
    assert says in advice
    assert "report it with this message" in advice


@pytest.mark.parametrize("returncode", [0, 1, 3, -signal.SIGTERM, -signal.SIGKILL])
def test_no_crash_advice_for_other_exits(returncode: int) -> None:
    """An exit code or a kill from outside is not a CPU problem: no advice."""
    assert crash_advice(returncode, SERVER, Build(Path("lib"), PORTABLE)) == ""


def test_cpu_library_found_beside_the_binary_or_in_lib(tmp_path: Path) -> None:
    """The package's layout (bin/ with versioned names only) and an install's lib/ both count."""
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server"
    binary.write_text("")
    assert find_cpu_library(binary) is None
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libggml-cpu.so").write_text("")
    assert find_cpu_library(binary) == tmp_path / "lib" / "libggml-cpu.so"
    (tmp_path / "bin" / "libggml-cpu.so.0.26.0").write_text("")
    assert find_cpu_library(binary) == tmp_path / "bin" / "libggml-cpu.so.0.26.0"


def test_probe_of_a_broken_library_says_why(tmp_path: Path) -> None:
    """A file that is no library: features unknown, the loader's complaint kept."""
    library = tmp_path / "libggml-cpu.so"
    library.write_text("not a library")
    build = probe_build(library)
    assert build.features is None
    assert build.failure.startswith("exit code 1") and "OSError" in build.failure


def test_check_cpu_lets_a_binary_without_ggml_library_through(tmp_path: Path) -> None:
    """A server whose CPU library cannot be found (a static build, a fake) is not refused."""
    binary = tmp_path / "llama-server"
    binary.write_text("")
    assert check_cpu(binary) is None


def test_cpu_module_stands_alone() -> None:
    """cpu.py loads by path with the standard library only (scripts/smoke_server.py does)."""
    path = ROOT / "pipeline" / "serving" / "cpu.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('cpu', {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec); sys.modules['cpu'] = module\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(module.PORTABLE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(PORTABLE))
