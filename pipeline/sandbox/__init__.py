"""Sandbox: run an untrusted Python program in a short-lived child the kernel confines.

Job hooks use it to execute model-written programs (program-aided math answers, code and
its tests, optimised programs); a record may carry a prompt injection, so every program
is treated as hostile. Each run starts ``python -I -S`` (isolated mode, no
site-packages) in a fresh temporary directory with an empty environment, in a session of
its own, killed whole at its deadline. Before the program's first line the child
confines itself, one-way (``kernel``, docs/sandbox.md):

- resource limits: address space, CPU seconds, file size 0, 64 open files, no core dumps;
- started as root, it leaves root: no capability (bounding and ambient sets included,
  securebits locked), no group, a user id of its own that bounds its threads;
- no_new_privs, then Landlock: read-only access to the interpreter's own directories, the
  system's shared libraries and its own directory, nothing else (no home, no run
  directory, no input, no ``/proc``); no TCP bind or connect; no signal or abstract
  socket out of its domain;
- a seccomp filter refusing with EPERM: sockets (an AF_UNIX socketpair excepted),
  exec, new processes (threads excepted, with a user id of its own), signals to other
  processes, ptrace and other processes' memory, io_uring, changing file metadata, and
  the kernel-administration calls.

The audit hook of earlier versions stays as a second line (refusing sockets, processes,
ctypes and writes at the Python level); nothing relies on it. In strict mode (the default)
a layer the kernel lacks means the program does not run; weak mode (``--sandbox weak``)
runs it with what there is. ``probe`` finds what this machine gives.

::

    policy     the mode (a context variable, never a global), layers, what was in force
    kernel     the child's side: limits, privileges, Landlock, seccomp (stdlib only)
    process    run_python: start the child, collect its output and result, kill it
    harness    the code that runs a program's tests or calls inside the child
    programs   run_tests, run_calls
    probe      which isolation this machine gives; require_isolation for strict runs

Thread-safe: no global state; every call owns its directory, pipes and process.
"""

from .policy import (
    ALL_LAYERS,
    KERNEL_LAYERS,
    Confinement,
    Layer,
    SandboxMode,
    SandboxPolicy,
    current_mode,
    use_mode,
)
from .probe import Isolation, probe, require_isolation
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
    "ALL_LAYERS",
    "KERNEL_LAYERS",
    "MAX_OUTPUT_BYTES",
    "TESTS_MEMORY_MB",
    "TESTS_PER_TEST_S",
    "TESTS_TIMEOUT_S",
    "Confinement",
    "Isolation",
    "Layer",
    "SandboxMode",
    "SandboxPolicy",
    "SandboxResult",
    "TestsRun",
    "current_mode",
    "probe",
    "require_isolation",
    "run_calls",
    "run_python",
    "run_tests",
    "syntax_problem",
    "use_mode",
]
