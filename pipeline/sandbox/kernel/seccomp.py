"""A seccomp-bpf filter: the calls a program may not make, refused with an errno.

The filter is classic BPF over ``struct seccomp_data`` (nr at 0, arch at 4, the
arguments from 16, eight bytes each, their low half first on the little-endian machines
supported). It kills the process for a foreign calling convention (another
``AUDIT_ARCH``, the x32 ABI's bit on x86-64: both number calls differently), answers
ENOSYS for calls newer than its table and for ``clone3`` (whose flags sit in memory a
filter cannot read; glibc then falls back to ``clone``), EPERM for the calls in
``syscalls.DENIED``, checks the arguments of the few calls in ``syscalls.GUARDED``, and
allows the rest. An errno rather than a kill lets the program see a PermissionError, and
its record a clear finding.
"""

from __future__ import annotations

import ctypes
import errno
import struct
import sys

from .libc import prctl
from .syscalls import DENIED, FIRST_UNKNOWN, arch_named

__all__ = ["ALLOW", "KILL", "Insn", "build", "deny", "install", "pack"]

# Instruction classes and fields (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_AND = 0x04 | 0x50 | 0x00  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06 | 0x00  # BPF_RET | BPF_K

# Return values (linux/seccomp.h).
ALLOW = 0x7FFF0000
KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_ERRNO = 0x00050000

_NR, _ARCH = 0, 4
X32_BIT = 0x40000000


def _arg(index: int) -> int:
    return 16 + 8 * index  # the low 32 bits: every guarded argument is an int


def deny(code: int) -> int:
    """The return value refusing a call with errno ``code``."""
    return _ERRNO | code


CLONE_THREAD = 0x00010000
# New namespaces, which no thread may ask for (CLONE_NEWTIME is a clone3 flag: in clone's
# low byte sits the exit signal).
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
_CLONE_NAMESPACES |= 0x20000000 | 0x40000000
AF_UNIX = 1
# fcntl commands that send another process signals (its owner gets SIGIO/SIGURG) or grow a
# pipe's buffer past the default, kernel memory no limit counts.
F_SETOWN, F_SETOWN_EX, F_SETPIPE_SZ = 8, 15, 1031
# ioctl commands doing the same, and faking input on a terminal.
FIOSETOWN, SIOCSPGRP, TIOCSTI = 0x8901, 0x8902, 0x5412

Insn = tuple[int, int, int, int]  # code, jump if true, jump if false, k


def _ld(offset: int) -> Insn:
    return (_LD_W_ABS, 0, 0, offset)


def _ret(value: int) -> Insn:
    return (_RET, 0, 0, value)


def _jeq(k: int, true: int = 0, false: int = 0) -> Insn:
    return (_JEQ, true, false, k)


def _only_if(nr: int, block: list[Insn]) -> list[Insn]:
    """``block`` (which always returns) for call ``nr``; the next check for every other."""
    return [_jeq(nr, 0, len(block)), *block]


def _refuse_values(offset: int, values: tuple[int, ...]) -> list[Insn]:
    """EPERM when the argument at ``offset`` is one of ``values``, else allow."""
    count = len(values)
    block = [_ld(offset)]
    block += [_jeq(v, count - i, 0) for i, v in enumerate(values)]
    return [*block, _ret(ALLOW), _ret(deny(errno.EPERM))]


def _allow_values(offset: int, values: tuple[int, ...]) -> list[Insn]:
    """Allow when the argument at ``offset`` is one of ``values``, else EPERM."""
    last = len(values) - 1
    block = [_ld(offset)]
    # a match jumps to ALLOW; the last comparison's miss jumps over it, to EPERM
    block += [_jeq(v & 0xFFFFFFFF, last - i, int(i == last)) for i, v in enumerate(values)]
    return [*block, _ret(ALLOW), _ret(deny(errno.EPERM))]


def build(machine: str, own_pid: int, *, threads: bool) -> list[Insn]:
    """The filter for ``machine`` (``os.uname().machine``) in a process whose pid is
    ``own_pid``: signals go to that process only; with ``threads`` it may start threads
    (``clone`` with CLONE_THREAD and no new namespace), else no ``clone`` at all.

    Raises LookupError for an architecture without a table.
    """
    found = arch_named(machine)
    if found is None or sys.byteorder != "little":
        raise LookupError(f"no seccomp filter is written for {machine}")
    audit_arch, numbers, x32 = found
    eperm = _ret(deny(errno.EPERM))
    prog = [_ld(_ARCH), _jeq(audit_arch, 1, 0), _ret(KILL), _ld(_NR)]
    if x32:
        prog += [(_JGE, 0, 1, X32_BIT), _ret(KILL)]
    prog += [(_JGE, 0, 1, FIRST_UNKNOWN), _ret(deny(errno.ENOSYS))]
    prog += [_jeq(numbers["clone3"], 0, 1), _ret(deny(errno.ENOSYS))]
    for names in DENIED.values():
        for name in names:
            if name in numbers:
                prog += [_jeq(numbers[name], 0, 1), eperm]
    if threads:
        thread = [_ld(_arg(0)), (_AND, 0, 0, CLONE_THREAD | _CLONE_NAMESPACES)]
        thread += [_jeq(CLONE_THREAD, 0, 1), _ret(ALLOW), eperm]
        prog += _only_if(numbers["clone"], thread)
    else:
        prog += [_jeq(numbers["clone"], 0, 1), eperm]
    prog += _only_if(numbers["socketpair"], _allow_values(_arg(0), (AF_UNIX,)))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        prog += _only_if(numbers[name], _allow_values(_arg(0), (own_pid,)))
    prog += _only_if(numbers["prlimit64"], _allow_values(_arg(0), (0, own_pid)))
    prog += _only_if(
        numbers["fcntl"], _refuse_values(_arg(1), (F_SETOWN, F_SETOWN_EX, F_SETPIPE_SZ))
    )
    prog += _only_if(numbers["ioctl"], _refuse_values(_arg(1), (FIOSETOWN, SIOCSPGRP, TIOCSTI)))
    return [*prog, _ret(ALLOW)]


def pack(prog: list[Insn]) -> bytes:
    """The filter as the kernel reads it: an array of ``struct sock_filter``."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


class _Fprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install(prog: list[Insn]) -> None:
    """Install ``prog`` on the calling thread (and all it starts); needs no_new_privs.

    Raises OSError when the kernel refuses it.
    """
    data = ctypes.create_string_buffer(pack(prog))
    fprog = _Fprog(len(prog), ctypes.cast(data, ctypes.c_void_p))
    prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog))
