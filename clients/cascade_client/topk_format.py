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
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

MAGIC = b"CTKX"
DOC_MAGIC = b"CTKD"
VERSION = 1
PAD_ID = 0xFFFFFFFF
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
class TopkDocument:
    """One document: ``targets[n]``, ``ids[n, k]`` (uint32) and ``logprobs[n, k]`` (float32)."""

    name: str
    start: int
    targets: npt.NDArray[np.uint32]
    ids: npt.NDArray[np.uint32]
    logprobs: npt.NDArray[np.float32]

    def __len__(self) -> int:
        return int(self.targets.shape[0])


def record_dtype(k: int) -> np.dtype[np.void]:
    return np.dtype([("target", "<u4"), ("ids", "<u4", (k,)), ("logprobs", "<f4", (k,))])


def encode_header(k: int, vocab_size: int) -> bytes:
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in 1..{MAX_K}")
    return _HEADER.pack(MAGIC, VERSION, 0, k, vocab_size)


def encode_document(name: str, start: int, k: int, targets: Sequence[int], ids: Sequence[Sequence[int]],
                    logprobs: Sequence[Sequence[float]]) -> bytes:
    """One document block; rows shorter than ``k`` are padded."""
    raw_name = name.encode("utf-8")
    if len(raw_name) > MAX_NAME:
        raise ValueError(f"document names are limited to {MAX_NAME} bytes")
    records = np.zeros(len(targets), dtype=record_dtype(k))
    records["ids"] = PAD_ID
    records["logprobs"] = -np.inf
    records["target"] = np.asarray(targets, dtype=np.uint32)
    for row, (row_ids, row_lps) in enumerate(zip(ids, logprobs, strict=True)):
        records["ids"][row, : len(row_ids)] = row_ids
        records["logprobs"][row, : len(row_lps)] = row_lps
    return (_DOC.pack(DOC_MAGIC, len(raw_name)) + raw_name + _DOC_TAIL.pack(start, len(targets))
            + records.tobytes())


def encode_arrays(name: str, start: int, k: int, targets: npt.NDArray[np.uint32], ids: npt.NDArray[np.uint32],
                  logprobs: npt.NDArray[np.float32]) -> bytes:
    """A document block from arrays already in the record layout (e.g. a slice of a read document)."""
    raw_name = name.encode("utf-8")[:MAX_NAME]
    records = np.empty(len(targets), dtype=record_dtype(k))
    records["target"], records["ids"], records["logprobs"] = targets, ids, logprobs
    return _DOC.pack(DOC_MAGIC, len(raw_name)) + raw_name + _DOC_TAIL.pack(start, len(targets)) + records.tobytes()


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


def iter_documents(stream: BinaryIO, header: Header, max_positions: int = 1 << 24) -> Iterator[TopkDocument]:
    """Documents one at a time (memory bounded by one document)."""
    dtype = record_dtype(header.k)
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
        records = np.frombuffer(_read_exact(stream, count * dtype.itemsize, "records"), dtype=dtype)
        yield TopkDocument(name, start, records["target"], records["ids"], records["logprobs"])


def read_all(stream: BinaryIO) -> tuple[Header, list[TopkDocument]]:
    header = read_header(stream)
    return header, list(iter_documents(stream, header))


def strip_header(data: bytes) -> tuple[Header, bytes]:
    """Split one response body into its header and its document blocks (for appending to a file)."""
    if len(data) < _HEADER.size:
        raise TopkFormatError("truncated top-k export: no header")
    import io

    header = read_header(io.BytesIO(data[: _HEADER.size]))
    return header, data[_HEADER.size:]
