"""Leaving root behind: a program never holds a capability, and cannot get one back.

When the child starts as root it locks its securebits (an exec would grant root nothing,
and the bits cannot be changed again), drops every capability from its bounding and
ambient sets, leaves every group, takes a user id of its own (``PRIVATE_BASE`` plus its
pid: no other process has it, so RLIMIT_NPROC counts this program's threads alone, and no
other process's files or signals are its own) and empties its capability sets.

For files, the child takes that id too where every directory the interpreter reads is open
to other users. Where one is not (a Python installed under /root, mode 0700, which another
user could not import from) it keeps uid 0 for file access only, with no capability: root's
files are then its own by ownership, and Landlock alone keeps it out of them.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

from .libc import prctl, syscall

__all__ = ["PRIVATE_BASE", "drop"]

# Above the ranges systemd gives regular users, dynamic users and containers (UIDS-GIDS.md),
# below its foreign range; a pid is below 2**22.
PRIVATE_BASE = 0x70000000

_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL = 47, 4
# NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS locked off.
_SECUREBITS = 0b11101111
_CAPABILITY_VERSION_3 = 0x20080522
_CAPGET = {"x86_64": 125, "aarch64": 90, "arm64": 90}
_CAPSET = {"x86_64": 126, "aarch64": 91, "arm64": 91}


def _open_to_others(path: str) -> bool:
    """Whether a user with no claim on ``path`` could read it (and reach it)."""
    real = os.path.realpath(path)
    try:
        last = os.stat(real)
        parts = real.split("/")
        for i in range(1, len(parts)):
            if not os.stat("/".join(parts[:i]) or "/").st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return True  # nothing there: it blocks no one
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(last.st_mode) else 0)
    return last.st_mode & wanted == wanted


def _capability_sets(machine: str, given: bytes | None = None) -> bytes:
    """Set the effective, permitted and inheritable sets to ``given``; read them without."""
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0), 8)
    sets = ctypes.create_string_buffer(given or bytes(24), 24)
    if given is None:
        syscall(_CAPGET[machine], header, sets, name="capget")
    else:
        syscall(_CAPSET[machine], header, sets, name="capset")
    return sets.raw


def drop(work: str, readable: list[str], machine: str) -> tuple[str, bool]:
    """Leave root, if the process runs as root: what it did, and whether the process now
    has a user id of its own (RLIMIT_NPROC then bounds its threads).

    ``work`` is its directory, ``readable`` what it will read. Raises OSError when a
    capability survives.
    """
    if os.geteuid() != 0:
        return f"not root (uid {os.getuid()})", False
    prctl(_PR_SET_SECUREBITS, _SECUREBITS)
    for cap in range(64):
        try:
            prctl(_PR_CAPBSET_DROP, cap)
        except OSError:
            break  # past the last capability this kernel knows
    prctl(_PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL)
    os.setgroups([])
    uid = PRIVATE_BASE + os.getpid()
    closed = next((p for p in readable if not _open_to_others(p)), None)
    try:
        os.setresgid(uid, uid, uid)
        if closed is None:
            os.chown(work, uid, uid)
            os.setresuid(uid, uid, uid)
            done = f"user {uid} of its own, no capabilities, no groups"
        else:
            os.setresuid(uid, 0, 0)
            done = (
                f"user {uid} of its own, no capabilities, no groups; files as uid 0 "
                f"({closed} is closed to other users)"
            )
        private = True
    except OSError as err:  # a user namespace that maps no such id
        done = f"no capabilities; still uid 0 ({err.strerror})"
        private = False
    _capability_sets(machine, bytes(24))
    if any(_capability_sets(machine)):
        raise OSError("a capability survived")
    return done, private
