"""Exact binary arithmetic coder (Nayuki-style), with streaming byte output.

A tiny state machine over 64-bit integer state: ``low``/``high`` bound the current interval, each
symbol narrows it to ``[low + range·cum/total, low + range·(cum+freq)/total)``, and matching top
bits are shifted out as they become final. Pending "underflow" bits play the role of the carry in
a range coder. Totals may be any integer up to 2**62, so one stream can mix the model's
2**precision tables with the uniform fallback over the rest of the vocabulary.

The decoder reads zeros past the end of its input: it never blocks or hangs; a truncated stream
decodes to wrong tokens, which the container's CRC turns into a clear error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

STATE_BITS = 64
FULL = 1 << STATE_BITS
MASK = FULL - 1
HALF = FULL >> 1
QUARTER = HALF >> 1
MAX_TOTAL = QUARTER + 2


def _check(low: int, freq: int, total: int) -> None:
    if not (0 < total <= MAX_TOTAL and freq > 0 and low >= 0 and low + freq <= total):
        raise ValueError(f"invalid interval low={low} freq={freq} total={total}")


class Encoder:
    """``encode`` returns the bytes that became final; ``finish`` flushes the rest."""

    def __init__(self) -> None:
        self.low = 0
        self.high = MASK
        self.underflow = 0
        self._bits = 0
        self._nbits = 0
        self._out = bytearray()

    def _emit(self, bit: int) -> None:
        self._bits = (self._bits << 1) | bit
        self._nbits += 1
        if self._nbits == 8:
            self._out.append(self._bits)
            self._bits = 0
            self._nbits = 0

    def _take(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def encode(self, low: int, freq: int, total: int) -> bytes:
        """Narrow the interval to symbol ``[low, low+freq)`` out of ``total``."""
        _check(low, freq, total)
        span = self.high - self.low + 1
        self.high = self.low + (low + freq) * span // total - 1
        self.low = self.low + low * span // total
        while ((self.low ^ self.high) & HALF) == 0:
            bit = self.low >> (STATE_BITS - 1)
            self._emit(bit)
            for _ in range(self.underflow):
                self._emit(bit ^ 1)
            self.underflow = 0
            self.low = (self.low << 1) & MASK
            self.high = ((self.high << 1) & MASK) | 1
        while (self.low & ~self.high & QUARTER) != 0:
            self.underflow += 1
            self.low = (self.low << 1) ^ HALF
            self.high = ((self.high ^ HALF) << 1) | HALF | 1
        return self._take() if self._out else b""

    def finish(self) -> bytes:
        """One more bit selects a point inside the final interval; pad to a byte boundary."""
        self._emit(1)
        while self._nbits:
            self._emit(0)
        return self._take()


class Decoder:
    """Mirrors ``Encoder``; ``source`` is bytes or an iterable of byte chunks."""

    def __init__(self, source: bytes | Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter([source]) if isinstance(source, bytes | bytearray) else iter(source)
        self._buf = b""
        self._pos = 0
        self._bit = 8
        self._byte = 0
        self.low = 0
        self.high = MASK
        self.code = 0
        self.bits_read = 0
        for _ in range(STATE_BITS):
            self.code = (self.code << 1) | self._read_bit()

    def _read_bit(self) -> int:
        if self._bit == 8:
            while self._pos >= len(self._buf):
                chunk = next(self._chunks, None)
                if chunk is None:
                    self._byte = 0
                    break
                self._buf, self._pos = bytes(chunk), 0
            else:
                self._byte = self._buf[self._pos]
                self._pos += 1
            self._bit = 0
        self._bit += 1
        self.bits_read += 1
        return (self._byte >> (8 - self._bit)) & 1

    def target(self, total: int) -> int:
        """The cumulative frequency the next symbol's interval contains."""
        span = self.high - self.low + 1
        value = ((self.code - self.low + 1) * total - 1) // span
        return min(max(value, 0), total - 1)

    def consume(self, low: int, freq: int, total: int) -> None:
        """Advance past the symbol ``[low, low+freq)`` chosen from ``target``."""
        _check(low, freq, total)
        span = self.high - self.low + 1
        self.high = self.low + (low + freq) * span // total - 1
        self.low = self.low + low * span // total
        while ((self.low ^ self.high) & HALF) == 0:
            self.code = ((self.code << 1) & MASK) | self._read_bit()
            self.low = (self.low << 1) & MASK
            self.high = ((self.high << 1) & MASK) | 1
        while (self.low & ~self.high & QUARTER) != 0:
            self.code = (self.code & HALF) | ((self.code << 1) & (MASK >> 1)) | self._read_bit()
            self.low = (self.low << 1) ^ HALF
            self.high = ((self.high ^ HALF) << 1) | HALF | 1
