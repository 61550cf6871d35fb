"""Token ids ↔ bytes: what lets the proposer follow the prediction as text, not as one tokenisation.

The model may write the predicted text with other token boundaries than the tokenised prediction
(``"utf8_x"`` as ``"utf" "8_x"`` instead of ``"utf8" "_x"``). Comparing bytes instead of ids keeps
the cursor on the prediction, and re-encoding the rest of the text from the output's last token
boundary gives drafts that start where the model's next token starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from cascade.export.token_table import _unicode_to_byte as unicode_to_byte


class Vocabulary(Protocol):
    def piece(self, token: int) -> bytes:
        """The bytes a token adds to the text (empty for special tokens)."""

    def encode(self, data: bytes) -> list[int]:
        """Tokens whose bytes are a prefix of ``data`` (all of it whenever the encoder can)."""


def text_of(vocab: Vocabulary, tokens: Iterable[int]) -> bytes:
    return b"".join(vocab.piece(t) for t in tokens)


def _continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def char_boundary(data: bytes, end: int) -> int:
    """The largest offset ≤ ``end`` that does not cut a UTF-8 character of ``data``."""
    end = min(end, len(data))
    while 0 < end < len(data) and _continuation(data[end]):
        end -= 1
    return end


class TokenizerVocabulary:
    """A ``Vocabulary`` from a table of token bytes and a text encoder (a tokenizer's ``encode``).

    The encoder takes ``str``, so text that starts inside a UTF-8 character (a model token can end
    mid-character) gets its first bytes from single-byte tokens; what the encoder returns is checked
    against the bytes, so a tokenizer that adds or normalises text can only shorten a draft.
    """

    def __init__(self, pieces: Sequence[bytes], encode_text: Callable[[str], list[int]]) -> None:
        self.pieces = pieces
        self._encode_text = encode_text
        self._by_piece = {piece: token for token, piece in enumerate(pieces) if len(piece) <= 4 and piece}

    def piece(self, token: int) -> bytes:
        return self.pieces[token] if 0 <= token < len(self.pieces) else b""

    def encode(self, data: bytes) -> list[int]:
        head = 0
        while head < len(data) and _continuation(data[head]):
            head += 1
        tokens: list[int] = []
        for byte in data[:head]:
            token = self._by_piece.get(bytes([byte]))
            if token is None:
                return tokens
            tokens.append(token)
        end = char_boundary(data, len(data))
        if end <= head:
            return tokens
        encoded = self._encode_text(data[head:end].decode("utf-8", errors="replace"))
        position = head
        for token in encoded:
            piece = self.piece(token)
            if not piece or not data.startswith(piece, position):
                break
            tokens.append(token)
            position += len(piece)
        return tokens


def token_pieces(spelled: Sequence[str | None], special: Iterable[int]) -> list[bytes]:
    """Token bytes from a vocabulary's spellings: byte-level BPE (GPT-2 style) when every spelling
    is made of its byte stand-ins, else SentencePiece (``<0x0A>`` byte fallback, ``▁`` for a space).
    Special tokens add no text."""
    table = unicode_to_byte()
    specials = set(special)
    plain = [None if token in specials else spelling for token, spelling in enumerate(spelled)]
    byte_level = all(c in table for spelling in plain if spelling for c in spelling)
    pieces: list[bytes] = []
    for spelling in plain:
        if not spelling:
            pieces.append(b"")
        elif byte_level:
            pieces.append(bytes(table[c] for c in spelling))
        elif len(spelling) == 6 and spelling.startswith("<0x") and spelling.endswith(">"):
            pieces.append(bytes([int(spelling[3:5], 16)]))
        else:
            pieces.append(spelling.replace("\u2581", " ").encode("utf-8"))
    return pieces
