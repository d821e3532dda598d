"""Sandbox: run an untrusted Python program in a limited, short-lived child process.

Job hooks use it to execute model-written programs (program-aided math answers,
optimised code). Each call starts ``python -I -S`` (isolated mode, no site-packages)
in a fresh temporary directory with an empty environment, in a new session so the
whole process group can be killed. Before the program runs, a small bootstrap in
the child

- sets resource limits: address space (``memory_mb``), CPU seconds, file size 0 (no
  file can grow), no core dumps, and no new processes where the kernel enforces that
  (``RLIMIT_NPROC`` is per user and not enforced for root, so it is set only for
  other users, and only in the child, where it cannot starve the user's other work);
- installs an audit hook that refuses network access, starting processes
  (subprocess, ``os.exec*``, ``os.system``, ``os.fork``, ``posix_spawn``), signalling
  other processes, raising resource limits, ``ctypes``, changing the file system and
  opening files for writing.

The limits are set by the bootstrap rather than in ``preexec_fn`` because
``preexec_fn`` is not safe in a threaded parent (hooks run in worker threads), and
the child runs nothing untrusted before the bootstrap has set them. The parent never
lets the child outlive ``timeout_s``: it kills the process group on the deadline.
This guards against mistakes and runaway programs, not against a determined attacker
(it is not a security boundary like a container or seccomp).

Thread-safe: no global state; every call owns its directory, pipes and process.
"""

from .process import MAX_OUTPUT_BYTES, SandboxResult, run_python, syntax_problem
from .programs import (
    TESTS_MEMORY_MB,
    TESTS_PER_TEST_S,
    TESTS_TIMEOUT_S,
    TestsRun,
    run_calls,
    run_tests,
)

__all__ = [
    "MAX_OUTPUT_BYTES",
    "TESTS_MEMORY_MB",
    "TESTS_PER_TEST_S",
    "TESTS_TIMEOUT_S",
    "SandboxResult",
    "TestsRun",
    "run_calls",
    "run_python",
    "run_tests",
    "syntax_problem",
]
