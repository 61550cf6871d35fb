"""The binary layout of a top-k export (``Accept: application/octet-stream``, ``cascade export-topk``).

All integers little-endian. A file is one header followed by any number of document blocks, so
blocks from many requests can be appended to one file as they arrive::

    header   "CTKX" | u16 version=1 | u16 flags=0 | u32 k | u32 vocab_size            (16 bytes)
    document "CTKD" | u16 name_len | name (UTF-8) | u64 start | u32 n_positions
             then n_positions records: u32 target | u32 ids[k] | f32 logprobs[k]

``start`` is the index, in the source token stream, of the document's first record. Each record
is the renormalised ("topk-renorm") distribution for the token ``target``, given everything before
it; ``ids`` are in canonical order (probability descending, id ascending). Positions where fewer
than ``k`` candidates survive the sampling stack are padded with id ``0xFFFFFFFF`` and ``-inf``.

Standard library only: the server writes documents with ``encode_document``; readers get each
block's records as bytes (``iter_blocks``), which the client views as arrays
(``cascade_client.topk_document``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"CTKX"
DOC_MAGIC = b"CTKD"
VERSION = 1
PAD_ID = 0xFFFFFFFF
PAD_LOGPROB = float("-inf")
_HEADER = struct.Struct("<4sHHII")
_DOC = struct.Struct("<4sH")
_DOC_TAIL = struct.Struct("<QI")
MAX_K = 1 << 16
MAX_NAME = 4096


class TopkFormatError(ValueError):
    """The bytes are not a complete, well-formed top-k export."""


@dataclass(frozen=True)
class Header:
    k: int
    vocab_size: int


@dataclass(frozen=True)
class DocumentBlock:
    """One document block as read: ``count`` records of ``record_size(k)`` bytes each in ``records``."""

    name: str
    start: int
    count: int
    records: bytes


@functools.lru_cache(maxsize=16)
def record_struct(k: int) -> struct.Struct:
    """One record: ``u32 target | u32 ids[k] | f32 logprobs[k]``."""
    return struct.Struct(f"<I{k}I{k}f")


def record_size(k: int) -> int:
    return 4 + 8 * k


def encode_header(k: int, vocab_size: int) -> bytes:
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in 1..{MAX_K}")
    return _HEADER.pack(MAGIC, VERSION, 0, k, vocab_size)


def document_head(raw_name: bytes, start: int, count: int) -> bytes:
    """A document block up to its records (``raw_name`` is the UTF-8 name)."""
    if len(raw_name) > MAX_NAME:
        raise ValueError(f"document names are limited to {MAX_NAME} bytes")
    return _DOC.pack(DOC_MAGIC, len(raw_name)) + raw_name + _DOC_TAIL.pack(start, count)


def encode_document(name: str, start: int, k: int, targets: Sequence[int], ids: Sequence[Sequence[int]],
                    logprobs: Sequence[Sequence[float]]) -> bytes:
    """One document block; rows shorter than ``k`` are padded."""
    if not len(targets) == len(ids) == len(logprobs):
        raise ValueError("targets, ids and logprobs must have one row per position")
    record = record_struct(k)
    out = bytearray(document_head(name.encode("utf-8"), start, len(targets)))
    for target, row_ids, row_lps in zip(targets, ids, logprobs, strict=True):
        if len(row_ids) > k or len(row_lps) > k:
            raise ValueError(f"a row has more than k={k} candidates")
        out += record.pack(target, *row_ids, *[PAD_ID] * (k - len(row_ids)),
                           *row_lps, *[PAD_LOGPROB] * (k - len(row_lps)))
    return bytes(out)


def _read_exact(stream: BinaryIO, n: int, what: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise TopkFormatError(f"truncated top-k export: {what} needs {n} bytes, got {len(data)}")
    return data


def read_header(stream: BinaryIO) -> Header:
    magic, version, _flags, k, vocab = _HEADER.unpack(_read_exact(stream, _HEADER.size, "header"))
    if magic != MAGIC:
        raise TopkFormatError("not a top-k export (bad magic)")
    if version != VERSION:
        raise TopkFormatError(f"unsupported top-k export version {version}")
    if not 1 <= k <= MAX_K:
        raise TopkFormatError(f"implausible k={k}")
    return Header(k, vocab)


def iter_blocks(stream: BinaryIO, header: Header, max_positions: int = 1 << 24) -> Iterator[DocumentBlock]:
    """Document blocks one at a time (memory bounded by one document), until the stream ends."""
    size = record_size(header.k)
    while True:
        first = stream.read(_DOC.size)
        if not first:
            return
        if len(first) != _DOC.size:
            raise TopkFormatError("truncated top-k export: partial document header")
        magic, name_len = _DOC.unpack(first)
        if magic != DOC_MAGIC or name_len > MAX_NAME:
            raise TopkFormatError("corrupt top-k export: bad document header")
        name = _read_exact(stream, name_len, "document name").decode("utf-8", errors="replace")
        start, count = _DOC_TAIL.unpack(_read_exact(stream, _DOC_TAIL.size, "document header"))
        if count > max_positions:
            raise TopkFormatError(f"document declares {count} positions (limit {max_positions})")
        yield DocumentBlock(name, start, count, _read_exact(stream, count * size, "records"))

