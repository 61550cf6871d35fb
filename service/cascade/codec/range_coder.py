"""Exact range coder (64-bit state, byte-wise renormalisation, carry propagation), streaming.

The encoder's state is the interval ``[low, low + range)`` of the next 64 bits of the code value;
each symbol ``[cum, cum + freq)`` of ``total`` narrows it to ``r = range // total`` units:
``low += r·cum; range = r·freq``. Invariants, all easy to check:

- after each symbol ``2**56 <= range <= 2**64``, so any ``total <= 2**32`` leaves ``r >= 2**24`` and
  the truncation costs under 2**-24 of a bit per symbol;
- when ``range`` drops below 2**56 the top byte of ``low`` leaves the state (``low`` shifts left by 8).
  ``low`` can overflow 2**64 by one carry, which must still reach bytes already shifted out; as in
  LZMA's range coder the last such byte (``cache``) and a run of 0xFF bytes after it (``pending``)
  are held back until a byte that a carry cannot pass proves them final;
- the code value always lies in ``[0, 1)``, so a carry never needs a byte before the first.

``encode*`` returns the bytes that became final, so a caller can stream them; ``finish`` emits the
fewest bytes that pin a value inside the last interval (the decoder reads zeros past the end, so
trailing zeros need not be written). Powers of two (the model's ``2**precision_bits`` tables) use a
shift instead of a division; ``*_with_total`` takes any total up to 2**32 (the uniform fallback over
the rest of a vocabulary).

How far a decoder reads past a valid stream (``MAX_OVERRUN``). The decoder's ``range`` follows the
encoder's exactly (same ``r``, same ``freq``), so after the symbols that made ``S`` renormalisation
shifts in the encoder, the decoder has read exactly ``8 + S`` bytes (8 to start, one per shift).
The encoder's stream has ``S + 2`` byte positions (``finish`` shifts twice); every position but the
last (the final ``cache``, always 0) is emitted, so it emits ``S + 1`` bytes and ``finish`` drops
``z`` trailing zeros of the bytes it emits itself: the decoder reads ``(8 + S) − (S + 1 − z) = 7 + z``
bytes past the payload's end, never more. ``finish`` drops at most ``MAX_STRIPPED_ZEROS`` (16)
zeros, so a valid stream is never read more than ``MAX_OVERRUN = 7 + 16 = 23`` bytes past its end,
and a decoder that needs more is reading a damaged or forged payload: it raises
``PayloadOverrunError`` at once instead of decoding tokens out of zero padding. (Release ddd10e1
dropped every trailing zero: ``z > 16`` there needs a run of ≥ 15 pending 0xFF bytes — the interval
straddling a byte boundary for 15 consecutive output bytes — which data-driven symbols meet with odds
near 2^-120; such a stream is refused, no other.) ``Decoder(..., max_overrun=None)`` lifts the
bound for callers that decode arbitrary bytes on purpose; it then never fails on short input.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

STATE_BITS = 64
TOP = 1 << STATE_BITS
MASK = TOP - 1
BOTTOM = 1 << (STATE_BITS - 8)
MAX_TOTAL = 1 << 32
_TOP_SHIFT = STATE_BITS - 8
_FF_LOW = 0xFF << _TOP_SHIFT
MAX_STRIPPED_ZEROS = 16
MAX_OVERRUN = 7 + MAX_STRIPPED_ZEROS


class PayloadOverrunError(ValueError):
    """The decoder needed more than ``MAX_OVERRUN`` bytes past the end of its payload: no valid stream
    does (module docstring), so the payload is damaged, cut short, or forged."""

    def __init__(self, read_past: int) -> None:
        super().__init__(f"the decoder needed {read_past} bytes past the payload's end (a valid stream is never "
                         f"read more than {MAX_OVERRUN} bytes past its end)")
        self.read_past = read_past
        self.tokens: int | None = None


def _invalid(low: int, freq: int, total: int) -> ValueError:
    return ValueError(f"invalid symbol interval low={low} freq={freq} total={total} (need 0 <= low, "
                      f"0 < freq, low + freq <= total <= 2**32)")


class Encoder:
    """Single use: ``encode``/``encode_with_total`` per symbol, then ``finish`` once."""

    __slots__ = ("_cache", "_low", "_out", "_pending", "_range")

    def __init__(self) -> None:
        self._low = 0
        self._range = TOP
        self._cache = -1
        self._pending = 0
        self._out = bytearray()

    def encode(self, low: int, freq: int, precision_bits: int) -> bytes:
        """Code ``[low, low + freq)`` out of ``2**precision_bits``; returns the bytes now final."""
        if not 0 <= low < low + freq <= 1 << precision_bits <= MAX_TOTAL:
            raise _invalid(low, freq, 1 << precision_bits)
        r = self._range >> precision_bits
        self._low += r * low
        self._range = r * freq
        return self._normalise() if self._range < BOTTOM else b""

    def encode_with_total(self, low: int, freq: int, total: int) -> bytes:
        """Code ``[low, low + freq)`` out of any ``total <= 2**32``; returns the bytes now final."""
        if not 0 <= low < low + freq <= total <= MAX_TOTAL:
            raise _invalid(low, freq, total)
        r = self._range // total
        self._low += r * low
        self._range = r * freq
        return self._normalise() if self._range < BOTTOM else b""

    def finish(self) -> bytes:
        """Flush: pick the value in ``[low, low + range)`` with the fewest significant bytes, and drop at
        most ``MAX_STRIPPED_ZEROS`` of the trailing zeros this emits (the bound ``MAX_OVERRUN`` rests on)."""
        low = self._low
        value = -(-low // TOP) * TOP
        if value >= low + self._range:
            value = -(-low // BOTTOM) * BOTTOM
        self._low = value
        self._shift()
        self._shift()
        self._range = TOP
        tail = self._take()
        return tail[:max(len(tail.rstrip(b"\0")), len(tail) - MAX_STRIPPED_ZEROS)]

    def _normalise(self) -> bytes:
        while self._range < BOTTOM:
            self._shift()
            self._range <<= 8
        return self._take()

    def _shift(self) -> None:
        """Move the top byte of ``low`` out, resolving the held bytes when a carry is decided."""
        low = self._low
        if low < _FF_LOW or low >= TOP:
            carry = low >> STATE_BITS
            if self._cache >= 0:
                self._out.append(self._cache + carry)
            if self._pending:
                self._out += bytes([(0xFF + carry) & 0xFF]) * self._pending
                self._pending = 0
            self._cache = (low >> _TOP_SHIFT) & 0xFF
        else:
            self._pending += 1
        self._low = (low << 8) & MASK

    def _take(self) -> bytes:
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out


class Decoder:
    """Mirrors ``Encoder``. ``source``: the whole stream, or an iterable of chunks pulled as needed.

    Per symbol: ``decode_target`` gives a cumulative frequency, the caller finds the symbol whose
    interval contains it, and ``consume`` advances past that interval (same totals as the encoder).
    ``padded_bytes`` counts the zeros read past the source's end; once they exceed ``max_overrun``
    (``MAX_OVERRUN`` by default, None for no bound) the next read raises ``PayloadOverrunError``.
    """

    __slots__ = ("_buf", "_chunks", "_code", "_max_overrun", "_pos", "_range", "padded_bytes")

    def __init__(self, source: bytes | bytearray | memoryview | Iterable[bytes],
                 max_overrun: int | None = MAX_OVERRUN) -> None:
        self._max_overrun = max_overrun
        self._chunks: Iterator[bytes]
        if isinstance(source, bytes | bytearray | memoryview):
            self._buf, self._chunks = bytes(source), iter(())
        else:
            self._buf, self._chunks = b"", iter(source)
        self._pos = 0
        self.padded_bytes = 0
        self._range = TOP
        self._code = 0
        for _ in range(STATE_BITS // 8):
            self._code = (self._code << 8) | self._next_byte()

    def decode_target(self, precision_bits: int) -> int:
        """The cumulative frequency (out of ``2**precision_bits``) inside the next symbol's interval."""
        total = 1 << precision_bits
        if total > MAX_TOTAL:
            raise _invalid(0, 1, total)
        target = self._code // (self._range >> precision_bits)
        return target if target < total else total - 1

    def decode_target_with_total(self, total: int) -> int:
        """As ``decode_target`` for any ``0 < total <= 2**32``."""
        if not 0 < total <= MAX_TOTAL:
            raise _invalid(0, 1, total)
        target = self._code // (self._range // total)
        return target if target < total else total - 1

    def consume(self, low: int, freq: int, precision_bits: int) -> None:
        """Advance past ``[low, low + freq)`` of ``2**precision_bits`` (it must contain the target)."""
        if not 0 <= low < low + freq <= 1 << precision_bits <= MAX_TOTAL:
            raise _invalid(low, freq, 1 << precision_bits)
        self._advance(self._range >> precision_bits, low, freq)

    def consume_with_total(self, low: int, freq: int, total: int) -> None:
        """As ``consume`` for any ``total <= 2**32``."""
        if not 0 <= low < low + freq <= total <= MAX_TOTAL:
            raise _invalid(low, freq, total)
        self._advance(self._range // total, low, freq)

    def _advance(self, r: int, low: int, freq: int) -> None:
        code = self._code - r * low
        rng = r * freq
        if not 0 <= code < rng:
            code = min(max(code, 0), rng - 1)
        while rng < BOTTOM:
            code = (code << 8) | self._next_byte()
            rng <<= 8
        self._code = code
        self._range = rng

    def _next_byte(self) -> int:
        if self._pos < len(self._buf):
            self._pos += 1
            return self._buf[self._pos - 1]
        for chunk in self._chunks:
            if chunk:
                self._buf, self._pos = bytes(chunk), 1
                return self._buf[0]
        self.padded_bytes += 1
        if self._max_overrun is not None and self.padded_bytes > self._max_overrun:
            raise PayloadOverrunError(self.padded_bytes)
        return 0
