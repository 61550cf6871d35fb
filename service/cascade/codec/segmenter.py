"""Split input bytes into independently codable segments, streaming (never the whole input at once).

Segments end at line boundaries where possible (and never inside a UTF-8 character), so each one
tokenises on its own and decodes in parallel. A segment whose bytes the tokenizer cannot reproduce
exactly (invalid UTF-8, or a lossy tokenizer) is stored raw: the codec stays exact for any input.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One segment: its bytes and, when codable, its token ids (``None`` = store raw)."""

    data: bytes
    tokens: list[int] | None


def _utf8_boundary(data: bytes, limit: int) -> int:
    """Largest cut ≤ limit that does not split a UTF-8 sequence (falls back to ``limit``)."""
    cut = limit
    while cut > 0 and cut > limit - 4 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > limit - 4 else limit


def split_bytes(buffer: bytes, target: int, final: bool) -> tuple[list[bytes], bytes]:
    """Cut complete pieces of about ``target`` bytes at newlines; returns (pieces, remainder)."""
    pieces: list[bytes] = []
    start = 0
    while len(buffer) - start >= target or (final and start < len(buffer)):
        window_end = start + target
        if window_end >= len(buffer):
            pieces.append(buffer[start:])
            start = len(buffer)
            break
        newline = buffer.rfind(b"\n", start + target // 2, window_end)
        cut = newline + 1 if newline >= 0 else start + _utf8_boundary(buffer[start:], target)
        pieces.append(buffer[start:cut])
        start = cut
    return pieces, buffer[start:]


class Segmenter:
    """Turn a byte stream into ``Segment``s of at most ``max_tokens`` tokens each."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], max_tokens: int,
                 target_bytes: int) -> None:
        self.encode = encode
        self.decode = decode
        self.max_tokens = max_tokens
        self.target_bytes = max(64, target_bytes)

    def segment(self, piece: bytes) -> Iterator[Segment]:
        """Tokenise a piece; halve it until it fits ``max_tokens``; raw when not round-trippable."""
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            yield Segment(piece, None)
            return
        tokens = self.encode(text)
        if len(tokens) > self.max_tokens and len(piece) > 1:
            middle = len(piece) // 2
            nl = piece.rfind(b"\n", 0, middle)
            cut = nl + 1 if nl > 0 else _utf8_boundary(piece, middle) or middle
            yield from self.segment(piece[:cut])
            yield from self.segment(piece[cut:])
            return
        if not tokens or len(tokens) > self.max_tokens or self.decode(tokens) != text:
            yield Segment(piece, None)
            return
        yield Segment(piece, tokens)

    async def segments(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[Segment]:
        """Segments of a streamed body, in order, holding at most ~2 targets of bytes."""
        buffer = b""
        async for chunk in chunks:
            buffer += chunk
            pieces, buffer = split_bytes(buffer, self.target_bytes, final=False)
            for piece in pieces:
                for segment in self.segment(piece):
                    yield segment
        pieces, _ = split_bytes(buffer, self.target_bytes, final=True)
        for piece in pieces:
            for segment in self.segment(piece):
                yield segment
