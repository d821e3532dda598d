"""Run a command as on a kernel without Landlock (its calls answer ENOSYS), as a container
that filters them would: ``python tests/without_landlock.py PROGRAM ARGS...``.

A test helper: the kernel's own seccomp filter, installed on this process and inherited by
everything it runs, stands in for the missing layer, so strict mode meets a real refusal.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.sandbox.kernel import seccomp
from pipeline.sandbox.kernel.libc import prctl

LANDLOCK_CALLS = (444, 445, 446)  # create_ruleset, add_rule, restrict_self: on every arch
LOAD_NR, JEQ, RET = 0x20, 0x15, 0x06


def main() -> None:
    prog: list[seccomp.Insn] = [(LOAD_NR, 0, 0, 0)]
    for nr in LANDLOCK_CALLS:
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, seccomp.deny(errno.ENOSYS))]
    prog.append((RET, 0, 0, seccomp.ALLOW))
    prctl(38, 1)  # PR_SET_NO_NEW_PRIVS: an unprivileged filter needs it
    seccomp.install(prog)
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
