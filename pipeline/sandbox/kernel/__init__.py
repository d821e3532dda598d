"""The child's side of the sandbox: confine the process it runs in, before a program runs.

::

    libc        prctl and syscall through ctypes
    privileges  leaving root: securebits, capabilities, a user id of its own
    landlock    the file system, TCP and signal rules
    syscalls    the numbers of the calls the filter names, per architecture
    seccomp     the filter: exec, new processes, sockets, other processes, kernel admin

Standard library only, and loaded by path: the child is ``python -I -S`` (no
site-packages) and imports this package alone, never ``pipeline``. ``confine`` applies,
in this order: resource limits; leaving root; no_new_privs (nothing gains a privilege at an
exec: Landlock and seccomp need it); Landlock; seccomp. Each is one-way: the program can
add restrictions, never lift one.
"""

from __future__ import annotations

import os
import resource
import sys

TYPE_CHECKING = False  # typing takes longer to import than all the rest: the child never does
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any

__all__ = ["KERNEL_LAYERS", "MAX_THREADS", "OPEN_FILES", "confine"]

KERNEL_LAYERS = ("privileges", "no_new_privs", "landlock", "seccomp")
MAX_THREADS = 32  # with a user id of its own; otherwise none
OPEN_FILES = 64  # descriptors at once (each pipe or socket pair holds kernel memory)

# Read-only beside the interpreter's own directories (``sys.path``): the shared libraries
# its extension modules load, the loader's cache, time zones. Nothing here is a secret.
_SYSTEM = (
    "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/share/zoneinfo",
    "/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random", "/dev/zero",
)  # fmt: skip
_PR_SET_NO_NEW_PRIVS = 38


def _limit(name: str, soft: int, hard: int) -> None:
    which = getattr(resource, name, None)
    if which is None:  # not on this system (RLIMIT_MSGQUEUE is Linux's)
        return
    ceiling = resource.getrlimit(which)[1]
    if ceiling != resource.RLIM_INFINITY:  # never ask for more than we may have
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(which, (soft, hard))


def _limits(memory: int, cpu: int) -> str:
    _limit("RLIMIT_AS", memory, memory)
    _limit("RLIMIT_CPU", cpu, cpu + 1)
    _limit("RLIMIT_FSIZE", 0, 0)  # no file grows: not even one the program may open
    _limit("RLIMIT_CORE", 0, 0)
    _limit("RLIMIT_NOFILE", OPEN_FILES, OPEN_FILES)
    _limit("RLIMIT_MEMLOCK", 0, 0)
    _limit("RLIMIT_MSGQUEUE", 0, 0)
    return f"memory {memory >> 20} MiB, CPU {cpu} s, file size 0, {OPEN_FILES} open files"


def confine(memory: int, cpu: int, layers: Collection[str]) -> dict[str, Any]:
    """Confine this process: resource limits, then each of ``layers`` (of
    ``KERNEL_LAYERS``) the kernel offers. Returns the report: ``applied`` (layer -> what
    is in force), ``missing`` (layer -> why not) and ``landlock_abi``.
    """
    wanted = [layer for layer in KERNEL_LAYERS if layer in layers]
    linux = sys.platform == "linux"
    if wanted and linux:  # imported before the file-size limit, so their bytecode is cached
        from . import landlock, privileges, seccomp
        from .libc import prctl
    applied: dict[str, str] = {"limits": _limits(memory, cpu)}
    missing: dict[str, str] = {}
    report: dict[str, Any] = {"applied": applied, "missing": missing, "landlock_abi": 0}
    if not wanted:
        return report
    if not linux:
        missing.update((layer, f"not available on {sys.platform}") for layer in wanted)
        return report
    machine = os.uname().machine
    own = [p for p in sys.path if p]  # the standard library, as this interpreter finds it
    private = False
    if "privileges" in wanted:
        try:
            applied["privileges"], private = privileges.drop(".", own, machine)
        except OSError as err:
            missing["privileges"] = str(err)
    if "landlock" in wanted or "seccomp" in wanted:
        try:
            prctl(_PR_SET_NO_NEW_PRIVS, 1)
            applied["no_new_privs"] = "set"
        except OSError as err:
            missing["no_new_privs"] = str(err)
    if "landlock" in wanted:
        version, why = landlock.abi()
        report["landlock_abi"] = version
        rules = [(p, landlock.READ) for p in [*own, *_SYSTEM, "."]]
        rules.append(("/dev/null", landlock.READ | landlock.WRITE))
        try:
            if not version:
                raise OSError(why)
            handled = landlock.restrict(version, rules)
            applied["landlock"] = f"ABI {version}: " + ", ".join(handled)
        except OSError as err:
            missing["landlock"] = str(err)
    if "seccomp" in wanted:
        try:
            prog = seccomp.build(machine, os.getpid(), threads=private)
            seccomp.install(prog)
            threads = f"at most {MAX_THREADS} threads" if private else "no threads"
            applied["seccomp"] = f"{len(prog)} instructions for {machine}; {threads}"
        except (LookupError, OSError) as err:
            missing["seccomp"] = str(err)
    # Counted per real user: only a user id of its own makes it this program's count. Its
    # threads, where the filter keeps clone to threads; else itself alone (no fork).
    tasks = (MAX_THREADS + 1 if "seccomp" in applied else 1) if private else 0
    _limit("RLIMIT_NPROC", tasks, tasks)
    return report
