"""Hostile programs against the sandbox: every way out is denied by the kernel, with the
audit hook in place and after a program has disabled it from inside."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.sandbox import (
    KERNEL_LAYERS,
    Layer,
    SandboxMode,
    SandboxPolicy,
    SandboxResult,
    run_python,
)
from pipeline.sandbox.kernel import MAX_THREADS
from pipeline.sandbox.kernel.privileges import PRIVATE_BASE
from tests.hostile_model import DISABLE_HOOK

SECRET = "s3cr3t-" + "do-not-leak-4417"

HOOK = pytest.mark.parametrize("disabled", [False, True], ids=["hook", "hook-disabled"])


def hostile(code: str, *, disabled: bool, **kwargs: object) -> SandboxResult:
    """Run ``code`` as a hostile program, first disabling the audit hook if ``disabled``."""
    program = (DISABLE_HOOK if disabled else "") + textwrap.dedent(code)
    return run_python(program, **kwargs)  # type: ignore[arg-type]


def refused(result: SandboxResult, *, by_kernel: bool) -> None:
    """The program failed on a PermissionError (the kernel's own, when ``by_kernel``)."""
    assert not result.ok and result.error is not None, result
    assert result.error.startswith("PermissionError"), result.error
    if by_kernel:
        assert "sandbox:" not in result.error, result.error
        assert "[Errno 1]" in result.error or "[Errno 13]" in result.error, result.error
    text = result.stdout + result.stderr + result.error + (result.value or "")
    assert SECRET not in text


def _private(uid: int) -> bool:
    return PRIVATE_BASE <= uid < PRIVATE_BASE + (1 << 22)


def private_processes() -> list[int]:
    """Processes a sandbox child left behind: under a child's own user id, and orphaned
    (adopted by init) or started by such a process. A child still running for another
    process's run has that process as its parent, and is not counted."""
    owners: dict[int, tuple[int, int]] = {}  # pid -> (real uid, parent pid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = dict(
                line.split(":", 1) for line in (entry / "status").read_text().splitlines()
            )
            uid, ppid = int(status["Uid"].split()[0]), int(status["PPid"])
        except (OSError, ValueError, KeyError):
            continue
        owners[int(entry.name)] = (uid, ppid)
    return sorted(
        pid
        for pid, (uid, ppid) in owners.items()
        if _private(uid) and (ppid == 1 or _private(owners.get(ppid, (0, 0))[0]))
    )


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """Another process of this user, with a secret in its environment."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={"OPENAI_API_KEY": SECRET, "PATH": os.environ.get("PATH", "")},
    )
    yield proc
    proc.kill()
    proc.wait()


def test_the_hook_can_be_disabled_from_inside() -> None:
    """The attack these tests repeat works: the audit hook stops refusing after it."""
    assert not run_python("import _posixsubprocess").ok  # the hook refuses it
    result = hostile("import _posixsubprocess", disabled=True)
    assert result.ok, result.error


@HOOK
def test_a_key_file_in_home_cannot_be_read(tmp_path: Path, disabled: bool) -> None:
    """A file beside the sandbox's directory (a key in HOME) is not readable; nor is HOME."""
    key = tmp_path / "id_ed25519"
    key.write_text(SECRET)
    key.chmod(0o600)
    result = hostile(f"print(open({str(key)!r}).read())", disabled=disabled)
    refused(result, by_kernel=True)
    refused(
        hostile(f"import os\nprint(os.listdir({str(Path.home())!r}))", disabled=disabled),
        by_kernel=True,
    )


@HOOK
def test_another_process_environment_cannot_be_read(
    victim: subprocess.Popen[bytes], disabled: bool
) -> None:
    """/proc/<pid>/environ of another process (and of the parent) is not readable."""
    for pid in (f"{victim.pid}", "{os.getppid()}"):
        code = f"import os\nprint(open(f'/proc/{pid}/environ').read())"
        refused(hostile(code, disabled=disabled), by_kernel=True)


@HOOK
def test_the_input_and_the_run_directory_cannot_be_read(tmp_path: Path, disabled: bool) -> None:
    """Files of the run (its input, its traces) are outside the program's reach."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "traces.jsonl").write_text(SECRET)
    (tmp_path / "input.jsonl").write_text(SECRET)
    for path in (tmp_path / "input.jsonl", run_dir / "traces.jsonl"):
        refused(hostile(f"print(open({str(path)!r}).read())", disabled=disabled), by_kernel=True)
    refused(
        hostile(f"import os\nprint(os.listdir({str(run_dir)!r}))", disabled=disabled),
        by_kernel=True,
    )


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A TCP server on loopback that nobody should reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


@HOOK
def test_tcp_connections_are_refused(tcp_listener: socket.socket, disabled: bool) -> None:
    """Connecting over TCP (even to loopback) fails and the listener sees no connection."""
    port = tcp_listener.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2).sendall(b'x')"
    refused(hostile(code, disabled=disabled), by_kernel=disabled)
    assert select.select([tcp_listener], [], [], 0)[0] == []  # nothing is waiting


@HOOK
def test_udp_is_refused(disabled: bool) -> None:
    """Sending a UDP datagram fails and nothing arrives."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        code = (
            "import socket\n"
            f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))"
        )
        refused(hostile(code, disabled=disabled), by_kernel=disabled)
        assert select.select([udp], [], [], 0)[0] == []


@HOOK
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_unix_sockets_are_refused(tmp_path: Path, disabled: bool, abstract: bool) -> None:
    """Connecting to a unix socket, by path or in the abstract namespace, fails."""
    address = f"\0refine-test-{os.getpid()}" if abstract else str(tmp_path / "sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(address)
        server.listen()
        server.setblocking(False)
        code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({address!r})"
        refused(hostile(code, disabled=disabled), by_kernel=disabled)
        assert select.select([server], [], [], 0)[0] == []


@HOOK
@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'true'])",
        "import os\nos.posix_spawn('/bin/true', ['true'], {})",
        "import subprocess\nsubprocess.run(['/bin/true'])",
    ],
    ids=["execv", "posix_spawn", "subprocess"],
)
def test_no_program_can_be_started(code: str, disabled: bool) -> None:
    """exec, spawn and subprocess all fail."""
    refused(hostile(code, disabled=disabled), by_kernel=disabled)


def test_system_starts_no_shell(tmp_path: Path) -> None:
    """os.system's shell never starts: it reports failure and its command leaves no trace."""
    planted = tmp_path / "planted"
    result = hostile(f"import os\nprint(os.system('touch {planted}'))", disabled=True)
    assert result.ok and result.stdout.strip() != "0", result
    assert not planted.exists()


@HOOK
def test_fork_and_a_surviving_session_are_refused(disabled: bool) -> None:
    """fork (and a raw fork syscall through ctypes) fails; no process of it survives."""
    code = """
    import os
    pid = os.fork()
    if pid == 0:
        os.setsid()
        import time
        time.sleep(60)
    """
    refused(hostile(code, disabled=disabled), by_kernel=disabled)
    raw = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(ctypes.c_long(57)) < 0:  # fork on x86-64 (ENOSYS elsewhere)
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    """
    result = hostile(raw, disabled=True)
    assert not result.ok and result.error is not None
    assert result.error.startswith(("PermissionError", "OSError: [Errno 38]")), result.error
    assert private_processes() == []


@HOOK
def test_signals_to_other_processes_are_refused(
    victim: subprocess.Popen[bytes], disabled: bool
) -> None:
    """kill, a pidfd signal and libc's kill through ctypes reach neither the parent nor
    another process."""
    for target in ("os.getppid()", str(victim.pid)):
        refused(hostile(f"import os\nos.kill({target}, 0)", disabled=disabled), by_kernel=disabled)
        code = f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({target}), 0)"
        refused(hostile(code, disabled=disabled), by_kernel=disabled)
    code = f"""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.kill(ctypes.c_int({victim.pid}), ctypes.c_int({int(signal.SIGKILL)})) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    """
    refused(hostile(code, disabled=True), by_kernel=True)
    assert victim.poll() is None  # alive


def test_root_cannot_be_regained() -> None:
    """setresuid back to root, capset and a new user namespace all fail through ctypes."""
    attempts = {
        "setresuid": "libc.setresuid(0, 0, 0)",
        "unshare": "libc.unshare(0x10000000)",  # CLONE_NEWUSER
        "prctl": "libc.prctl(47, 2, 12, 0, 0)",  # raise CAP_NET_ADMIN into the ambient set
    }
    for name, call in attempts.items():
        code = f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        if {call} != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        print(os.getresuid())
        """
        result = hostile(code, disabled=True)
        assert not result.ok and result.error is not None, (name, result)
        assert result.error.startswith(("PermissionError", "OSError")), (name, result.error)


@HOOK
def test_nothing_can_be_written_inside_or_outside(tmp_path: Path, disabled: bool) -> None:
    """No file is created outside the program's directory, nor inside it."""
    outside = tmp_path / "planted.txt"
    for path in (str(outside), "inside.txt", "/tmp/refine-planted.txt"):
        refused(hostile(f"open({path!r}, 'w').write('x')", disabled=disabled), by_kernel=disabled)
    assert not outside.exists() and not Path("/tmp/refine-planted.txt").exists()


@HOOK
def test_file_metadata_cannot_be_changed(tmp_path: Path, disabled: bool) -> None:
    """chmod and utime, which Landlock does not cover, are refused by the filter."""
    target = tmp_path / "keep.txt"
    target.write_text("x")
    target.chmod(0o600)
    for call in (f"os.chmod({str(target)!r}, 0o777)", f"os.utime({str(target)!r}, (0, 0))"):
        refused(hostile(f"import os\n{call}", disabled=disabled), by_kernel=disabled)
    assert target.stat().st_mode & 0o777 == 0o600 and target.stat().st_mtime > 0


def test_memory_exhaustion_is_contained() -> None:
    """Allocating past the limit fails with MemoryError; so does a memfd past it."""
    result = hostile("chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))", disabled=True)
    assert not result.ok and result.error is not None and "MemoryError" in result.error
    memfd = "import os\nos.memfd_create('x')"
    refused(hostile(memfd, disabled=True), by_kernel=True)


def test_cpu_exhaustion_is_contained() -> None:
    """A program spinning in every thread it may start is stopped at its deadline."""
    code = """
    import threading
    def spin():
        while True:
            pass
    for _ in range(4):
        try:
            threading.Thread(target=spin, daemon=True).start()
        except RuntimeError:
            break
    spin()
    """
    start = time.monotonic()
    result = hostile(code, disabled=True, timeout_s=1.0)
    assert result.timed_out and time.monotonic() - start < 10
    assert private_processes() == []


def test_thread_exhaustion_is_bounded() -> None:
    """Threads past a small bound fail to start (with a user id of its own; none without)."""
    code = """
    import threading
    gate = threading.Event()
    started = 0
    try:
        for _ in range(1000):
            threading.Thread(target=gate.wait, daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    gate.set()
    print(started)
    """
    result = hostile(code, disabled=True)
    assert result.ok, result.error
    assert int(result.stdout) <= MAX_THREADS


def test_open_files_are_bounded() -> None:
    """Pipes (kernel memory no other limit counts) stop at the open-file limit."""
    code = "import os\nfds = []\nwhile True:\n    fds.extend(os.pipe())"
    result = hostile(code, disabled=True)
    assert not result.ok and result.error is not None and "Errno 24" in result.error


def test_a_child_reports_every_layer_in_force() -> None:
    """Every layer is in force by default, and the report says so."""
    confinement = run_python("pass").confinement
    assert confinement is not None
    assert set(confinement.applied) == set(Layer) and not confinement.missing
    assert confinement.landlock_abi >= 1


def test_kernel_layers_alone_deny_without_the_hook() -> None:
    """With only the kernel's layers asked for, the audit hook is absent, and the kernel
    still refuses (what `refine sandbox` shows)."""
    policy = SandboxPolicy(SandboxMode.STRICT, KERNEL_LAYERS)
    result = run_python("import _posixsubprocess\nimport socket\nsocket.socket()", policy=policy)
    refused(result, by_kernel=True)
    assert result.confinement is not None and Layer.AUDIT_HOOK not in result.confinement.applied
