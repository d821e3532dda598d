"""Opening an input as a stream of its decompressed bytes, read in bounded chunks."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import Path
from typing import Any

from .formats import Compression

__all__ = ["DECOMPRESSION_ERRORS", "open_bytes"]

# What a damaged or truncated compressed stream raises part-way through.
DECOMPRESSION_ERRORS: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error, lzma.LZMAError)
_BUFFER = 1 << 20
_ZSTD_READ = 1 << 16  # compressed bytes fed at a time: bounds what one feed can expand to


def open_bytes(path: Path, compression: Compression | None) -> io.BufferedIOBase:
    """The file's content, decompressed when it is compressed; iterating it yields lines."""
    if compression is None:
        return path.open("rb")
    if compression == "gzip":
        return gzip.open(path, "rb")  # also reads concatenated members (appended with cat)
    if compression == "bzip2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    return io.BufferedReader(_ZstdFrames(path.open("rb")), _BUFFER)


class _ZstdFrames(io.RawIOBase):
    """Consecutive zstd frames, decompressed; a stream cut inside a frame raises EOFError.

    zstandard's own stream reader ends quietly at a truncated frame, which would lose the
    rest of an input without a word; like gzip, a cut stream must be an error.
    """

    def __init__(self, raw: io.BufferedIOBase) -> None:
        import zstandard  # the zstd extra; formats.detect checked it is installed

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame: Any = self._dctx.decompressobj()
        self._in_frame = False  # bytes of the current frame were fed, its end not yet seen
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        """Always: this is a reader."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with decompressed bytes; 0 at the end of the last frame."""
        while self._pos >= len(self._out):
            data = self._raw.read(_ZSTD_READ)
            if not data:
                if self._in_frame:
                    raise EOFError("zstd stream ended before the end of its frame")
                return 0
            self._out, self._pos = self._feed(data), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, data: bytes) -> bytes:
        parts = []
        while data:
            self._in_frame = True
            parts.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data = self._frame.unused_data  # the next frame starts here
            self._frame = self._dctx.decompressobj()
            self._in_frame = False
        return b"".join(parts)

    def close(self) -> None:
        """Close the compressed file too."""
        self._raw.close()
        super().close()
