"""Shards: a run split by record id for schedulers other than Ray (CI matrices, job arrays).

``--shard I/N`` keeps the records whose id hashes to shard I of N. The hash is of the
record id (the ``--id-field`` value or the content hash), so the split does not depend
on the order of the input or on which machine reads it, and every record belongs to
exactly one shard.
"""

from __future__ import annotations

import hashlib

__all__ = ["shard_of"]


def shard_of(record_id: str, count: int) -> int:
    """The shard (0..count-1) that ``record_id`` belongs to."""
    digest = hashlib.blake2b(record_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count
