"""The seccomp filter, read by a small BPF interpreter: what it answers for each call and
argument, on both architectures, and its system call numbers against the kernel's headers."""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from pipeline.sandbox.kernel import seccomp
from pipeline.sandbox.kernel.syscalls import AARCH64, ARCHES, DENIED, GUARDED, X86_64

OWN_PID = 4242
ALLOW = seccomp.ALLOW
KILL = seccomp.KILL
EPERM = seccomp.deny(errno.EPERM)
ENOSYS = seccomp.deny(errno.ENOSYS)
CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND = 0x100, 0x200, 0x400, 0x800
PTHREAD = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | seccomp.CLONE_THREAD | 0x3D0000
SIGCHLD = 17


def run_filter(prog: list[seccomp.Insn], arch: int, nr: int, *args: int) -> int:
    """What the kernel's BPF machine returns for this call (the subset the filter uses)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    acc, pc = 0, 0
    while True:
        assert 0 <= pc < len(prog), "the filter ran off its end"
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:  # ld word at k
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x15:  # jeq
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge
            pc += jt if acc >= k else jf
        elif code == 0x54:  # and
            acc &= k
        elif code == 0x06:  # ret
            return k
        else:
            raise AssertionError(f"instruction {code:#x} is not one this interpreter knows")


MACHINES = {"x86_64": X86_64, "aarch64": AARCH64}


@pytest.fixture(params=sorted(MACHINES))
def machine(request: pytest.FixtureRequest) -> str:
    """Each architecture the filter is written for."""
    return str(request.param)


def decide(machine: str, name: str, *args: int, threads: bool = True) -> int:
    audit_arch, numbers, _ = ARCHES[machine]
    prog = seccomp.build(machine, OWN_PID, threads=threads)
    return run_filter(prog, audit_arch, numbers[name], *args)


def test_every_denied_call_is_refused_with_eperm(machine: str) -> None:
    """Each call of the denied groups that the architecture has answers EPERM."""
    numbers = MACHINES[machine]
    for names in DENIED.values():
        for name in names:
            if name in numbers:
                assert decide(machine, name) == EPERM, name


def test_every_named_call_exists_somewhere() -> None:
    """No name in the filter's lists is a typo: each is in some architecture's table."""
    named = {n for names in DENIED.values() for n in names} | set(GUARDED)
    assert sorted(n for n in named if n not in X86_64 and n not in AARCH64) == []
    assert sorted(n for n in GUARDED if n not in X86_64 or n not in AARCH64) == []


@pytest.mark.parametrize(
    ("call", "args", "answer"),
    [
        ("socketpair", (1,), ALLOW),  # AF_UNIX: asyncio's self-pipe
        ("socketpair", (2,), EPERM),  # AF_INET
        ("kill", (OWN_PID, 9), ALLOW),
        ("kill", (OWN_PID + 1, 9), EPERM),
        ("kill", (0, 9), EPERM),  # its process group
        ("kill", (0xFFFFFFFF, 9), EPERM),  # -1: every process it may signal
        ("tgkill", (OWN_PID, OWN_PID, 10), ALLOW),
        ("tgkill", (1, 1, 9), EPERM),
        ("rt_sigqueueinfo", (1, 9, 0), EPERM),
        ("rt_tgsigqueueinfo", (OWN_PID, OWN_PID, 10, 0), ALLOW),
        ("prlimit64", (0, 7, 0, 0), ALLOW),
        ("prlimit64", (OWN_PID, 7, 0, 0), ALLOW),
        ("prlimit64", (OWN_PID + 1, 7, 1, 0), EPERM),
        ("fcntl", (3, 3), ALLOW),  # F_GETFL
        ("fcntl", (3, seccomp.F_SETOWN, 1), EPERM),
        ("fcntl", (3, seccomp.F_SETPIPE_SZ, 1 << 20), EPERM),
        ("ioctl", (0, 0x5401), ALLOW),  # TCGETS (isatty)
        ("ioctl", (0, seccomp.TIOCSTI), EPERM),
        ("ioctl", (3, seccomp.FIOSETOWN), EPERM),
        ("clone3", (0, 88), ENOSYS),  # glibc falls back to clone
        ("clone", (PTHREAD,), ALLOW),  # a thread
        ("clone", (SIGCHLD,), EPERM),  # fork
        ("clone", (CLONE_VM | 0x4000 | SIGCHLD,), EPERM),  # vfork (posix_spawn)
        ("clone", (PTHREAD | 0x10000000,), EPERM),  # a thread in a new user namespace
        ("clone", (PTHREAD | 0x40000000,), EPERM),  # ... or network namespace
    ],
)
def test_guarded_calls_depend_on_their_arguments(
    machine: str, call: str, args: tuple[int, ...], answer: int
) -> None:
    """Signals only to itself, unix socket pairs only, threads but no process, no owner
    for SIGIO, no faked terminal input."""
    assert decide(machine, call, *args) == answer


def test_without_threads_no_clone_at_all(machine: str) -> None:
    """Where no user id of its own bounds them, threads are refused too."""
    assert decide(machine, "clone", PTHREAD, threads=False) == EPERM


def test_ordinary_calls_are_allowed(machine: str) -> None:
    """Reading, writing, memory and time are untouched."""
    numbers = {"x86_64": (0, 1, 9, 228), "aarch64": (63, 64, 222, 113)}[machine]
    audit_arch = ARCHES[machine][0]
    prog = seccomp.build(machine, OWN_PID, threads=True)
    assert [run_filter(prog, audit_arch, nr, 0, 0) for nr in numbers] == [ALLOW] * 4


def test_unknown_and_foreign_calls(machine: str) -> None:
    """A call newer than the table answers ENOSYS; another calling convention is killed."""
    audit_arch, _, x32 = ARCHES[machine]
    prog = seccomp.build(machine, OWN_PID, threads=True)
    assert run_filter(prog, audit_arch, 470) == ENOSYS
    assert run_filter(prog, audit_arch, 1000) == ENOSYS
    assert run_filter(prog, 0x40000003, 1) == KILL  # i386's int 0x80
    assert run_filter(prog, 0x40000028, 1) == KILL  # 32-bit arm
    if x32:
        assert run_filter(prog, audit_arch, 0x40000000 | 59) == KILL  # x32's execve


def test_an_unknown_machine_has_no_filter() -> None:
    """An architecture without a table gets no filter (strict mode then refuses to run)."""
    with pytest.raises(LookupError):
        seccomp.build("riscv64", OWN_PID, threads=True)


def test_the_filter_fits_the_kernel(machine: str) -> None:
    """At most 4096 instructions, eight bytes each, every jump inside the program."""
    prog = seccomp.build(machine, OWN_PID, threads=True)
    assert len(prog) <= 4096 and len(seccomp.pack(prog)) == 8 * len(prog)
    for pc, (code, jt, jf, _) in enumerate(prog):
        if code in (0x15, 0x35):
            assert pc + 1 + max(jt, jf) < len(prog)


def _header(path: str, pattern: str) -> dict[str, int]:
    text = Path(path).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(pattern, text)}


X86_HEADER = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
GENERIC_HEADER = "/usr/include/asm-generic/unistd.h"


@pytest.mark.skipif(not Path(X86_HEADER).exists(), reason="no kernel headers installed")
@pytest.mark.parametrize(
    ("table", "path", "pattern"),
    [
        (X86_64, X86_HEADER, r"#define __NR_(\w+)\s+(\d+)"),
        (AARCH64, GENERIC_HEADER, r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
    ],
    ids=["x86_64", "aarch64"],
)
def test_numbers_match_the_kernel_headers(table: dict[str, int], path: str, pattern: str) -> None:
    """Every number the filter uses is the one the installed headers give (where they know it)."""
    known = _header(path, pattern)
    wrong = {n: (nr, known[n]) for n, nr in table.items() if n in known and known[n] != nr}
    assert wrong == {}
