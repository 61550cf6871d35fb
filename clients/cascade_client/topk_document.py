"""Top-k exports as numpy arrays: the client's view of ``cascade_common.topk_format``'s layout."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
from cascade_common.topk_format import MAX_NAME, Header, document_head, iter_blocks, read_header


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


def encode_arrays(name: str, start: int, k: int, targets: npt.NDArray[np.uint32], ids: npt.NDArray[np.uint32],
                  logprobs: npt.NDArray[np.float32]) -> bytes:
    """A document block from arrays already in the record layout (e.g. a slice of a read document)."""
    records = np.empty(len(targets), dtype=record_dtype(k))
    records["target"], records["ids"], records["logprobs"] = targets, ids, logprobs
    return document_head(name.encode("utf-8")[:MAX_NAME], start, len(targets)) + records.tobytes()


def iter_documents(stream: BinaryIO, header: Header, max_positions: int = 1 << 24) -> Iterator[TopkDocument]:
    """Documents one at a time (memory bounded by one document)."""
    dtype = record_dtype(header.k)
    for block in iter_blocks(stream, header, max_positions):
        records = np.frombuffer(block.records, dtype=dtype)
        yield TopkDocument(block.name, block.start, records["target"], records["ids"], records["logprobs"])


def read_all(stream: BinaryIO) -> tuple[Header, list[TopkDocument]]:
    header = read_header(stream)
    return header, list(iter_documents(stream, header))
