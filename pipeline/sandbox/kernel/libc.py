"""The two C entry points the kernel layers call: ``prctl`` and ``syscall``.

Every argument is passed as a C ``long`` (or a pointer): both are variadic, and a Python
int would otherwise go as a 32-bit ``int`` into a register the kernel reads whole.
"""

from __future__ import annotations

import ctypes
import errno

TYPE_CHECKING = False  # typing takes longer to import than all the rest: the child never does
if TYPE_CHECKING:
    from typing import Any

__all__ = ["prctl", "syscall"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.restype = ctypes.c_int
_libc.syscall.restype = ctypes.c_long


def _c(value: Any) -> Any:
    return ctypes.c_long(value) if isinstance(value, int) else value


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {errno.errorcode.get(code, str(code))}")
    return result


def prctl(option: int, *args: Any) -> int:
    """``prctl(option, args...)``; raises OSError with the errno when it fails."""
    padded = [*args, 0, 0, 0, 0][:4]
    return _check(_libc.prctl(ctypes.c_int(option), *map(_c, padded)), f"prctl({option})")


def syscall(number: int, *args: Any, name: str = "") -> int:
    """System call ``number`` with ``args``; raises OSError with the errno when it fails."""
    return _check(_libc.syscall(ctypes.c_long(number), *map(_c, args)), name or str(number))
