"""Token id → (display string, raw bytes), built once per tokenizer.

Export responses carry thousands of candidates per request; decoding each through the tokenizer
would dominate the cost, so the table is computed once. Byte-level BPE vocabularies map back to
exact bytes through the inverse of the GPT-2 byte↔unicode alphabet, SentencePiece vocabularies
through their ``▁`` and ``<0xHH>`` spellings; other tokens fall back to the tokenizer's own decode.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet: printable bytes map to themselves, the rest to 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass(frozen=True)
class TokenTable:
    strings: tuple[str, ...]
    raw: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.strings)

    def string(self, token: int) -> str:
        """The token's text; ``""`` for an id past the tokenizer (models often pad their output
        vocabulary beyond it, e.g. to a multiple of 64, and those ids can still be ranked)."""
        return self.strings[token] if 0 <= token < len(self.strings) else ""

    def data(self, token: int) -> bytes:
        """The token's bytes; empty for an id past the tokenizer (see ``string``)."""
        return self.raw[token] if 0 <= token < len(self.raw) else b""


def _sentencepiece_bytes(piece: str) -> bytes:
    """A SentencePiece token's bytes: ``<0x0A>`` byte-fallback tokens are that byte, ``▁`` a space."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


def build_token_table(tokenizer: Any) -> TokenTable:
    """Every token's bytes as it adds them to a text: byte-level BPE spellings mapped back through
    the GPT-2 alphabet, SentencePiece spellings with ``▁`` as a space and ``<0xHH>`` as that byte
    (decoding one SentencePiece token alone drops its leading space), specials as spelled, and
    anything else as the tokenizer decodes it."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    inverse = _unicode_to_byte()
    spelled = [piece for piece in pieces if piece]
    sentencepiece = sum("\u2581" in piece for piece in spelled) > sum("\u0120" in piece for piece in spelled)
    strings, raw = [], []
    for token_id, piece in enumerate(pieces):
        if token_id in special and piece:
            data = piece.encode("utf-8")
        elif sentencepiece and piece:
            data = _sentencepiece_bytes(piece)
        elif piece and all(ch in inverse for ch in piece):
            data = bytes(inverse[ch] for ch in piece)
        else:
            data = tokenizer.decode([token_id]).encode("utf-8")
        raw.append(data)
        strings.append(data.decode("utf-8", errors="replace"))
    return TokenTable(tuple(strings), tuple(raw))


def max_chars_per_token(tokenizer: Any) -> int:
    """The most characters of text one token can cover: its characters that start within it, plus one
    for a character it completes (a token may hold the tail of a multi-byte character). Text of n
    characters is therefore at least n / this many tokens, whatever its content."""
    best = 1
    for data in build_token_table(tokenizer).raw:
        if data:
            starts = sum(1 for byte in data if byte & 0xC0 != 0x80)
            best = max(best, starts + (1 if data[0] & 0xC0 == 0x80 else 0))
    return best
