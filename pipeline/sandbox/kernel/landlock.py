"""Landlock: the file system, TCP and signal rules a process puts on itself.

A ruleset handles every access right the kernel's ABI knows; what no rule grants is
denied, beneath every path. ABI 1 handles the file system, 2 adds moving files between
directories (refer), 3 truncation, 4 TCP bind and connect, 5 ioctl on devices, 6 scopes
(signals and abstract unix sockets to processes outside the domain). Rules here only ever
grant reading: a directory's files and listing, or one file.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from .libc import syscall

__all__ = ["READ", "WRITE", "abi", "restrict"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_IOCTL_DEV = 1 << 15  # ABI 5
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV

READ = _READ_FILE | _READ_DIR  # a directory's files, and listing it
WRITE = _WRITE_FILE | _TRUNCATE  # an existing file (a device such as /dev/null)

_NET_TCP = 0b11  # bind, connect (ABI 4)
_SCOPES = 0b11  # abstract unix sockets, signals (ABI 6)


def abi() -> tuple[int, str]:
    """The kernel's Landlock ABI version, 0 without Landlock, and why not."""
    try:
        return syscall(_CREATE_RULESET, 0, 0, _CREATE_RULESET_VERSION, name="landlock"), ""
    except OSError as err:
        why = {
            errno.ENOSYS: "the kernel was built without it",
            errno.EOPNOTSUPP: "the kernel has it, turned off (boot with lsm=...,landlock)",
            errno.EPERM: "refused by a seccomp filter around this process (a container?)",
        }.get(err.errno or 0, str(err))
        return 0, why


def _fs_rights(version: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute ... make symlink
    if version >= 2:
        rights |= _REFER
    if version >= 3:
        rights |= _TRUNCATE
    if version >= 5:
        rights |= _IOCTL_DEV
    return rights


def restrict(version: int, rules: list[tuple[str, int]]) -> list[str]:
    """Confine this process (and all it starts) to ``rules``: (path, rights), the rights
    granted beneath a directory, or on a file (its file rights only). Paths that cannot be
    opened are left out. Returns what the ruleset handles, for the report.

    Needs no_new_privs (or CAP_SYS_ADMIN); raises OSError when the kernel refuses.
    """
    handled_fs = _fs_rights(version)
    net = _NET_TCP if version >= 4 else 0
    scoped = _SCOPES if version >= 6 else 0
    packed = struct.pack("=QQQ", handled_fs, net, scoped)
    attr = ctypes.create_string_buffer(packed, len(packed))
    ruleset = syscall(_CREATE_RULESET, attr, len(packed), 0, name="landlock_create_ruleset")
    try:
        for path, rights in rules:
            _add_path(ruleset, path, rights & handled_fs)
        syscall(_RESTRICT_SELF, ruleset, 0, name="landlock_restrict_self")
    finally:
        os.close(ruleset)
    handled = ["file system"]
    handled += ["TCP bind and connect"] if net else []
    handled += ["signals and abstract unix sockets"] if scoped else []
    return handled


def _add_path(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # nothing there to grant
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        packed = struct.pack("=Qi", rights, fd)
        attr = ctypes.create_string_buffer(packed, len(packed))
        syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0, name="landlock_add_rule")
    finally:
        os.close(fd)
