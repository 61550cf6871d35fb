"""One spelling of the prediction: its bytes, where the output's recent bytes occur in it, and the
tokens to draft from any byte offset.

The proposer follows the prediction as text, not as one tokenisation: the model may write the same
text with other token boundaries, so the text from the cursor is re-tokenised when the output's last
token ended inside a predicted token. Re-anchoring looks up the longest suffix of the output's
recent bytes in the text (C-speed ``bytes.find``/``rfind``, a binary search on the length: if a
suffix occurs, so do all shorter ones), and among its occurrences takes the one nearest to where the
output is expected to be in the prediction, so a look-alike line far away loses to the region the
output is editing.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from cascade.predict.vocabulary import Vocabulary, char_boundary

_BLANK_RUN = re.compile(rb"[ \t]+(?=\n)|\n(?:[ \t]*\n)+")


def collapse_blank_lines(text: bytes) -> bytes:
    """The prediction as small instruct models tend to write it: no trailing whitespace on a line and
    at most one blank line in a row."""
    return _BLANK_RUN.sub(lambda m: b"" if m.group(0)[0:1] != b"\n" else b"\n\n", text)


@dataclass(frozen=True)
class Anchor:
    """The output's last ``length`` bytes equal ``text[end - length:end]`` (``end`` < len(text))."""

    end: int
    length: int
    ambiguous: bool


class PredictionText:
    """Bytes of one spelling of the prediction and a tokenisation to draft from."""

    def __init__(self, text: bytes, vocab: Vocabulary, ids: list[int] | None = None,
                 window_bytes_per_token: int = 8) -> None:
        self.text = text
        self.vocab = vocab
        self.window_bytes_per_token = window_bytes_per_token
        self.retokenised = 0
        self._set_tokens(ids if ids is not None else [], 0)

    def __len__(self) -> int:
        return len(self.text)

    def _set_tokens(self, ids: list[int], start: int) -> None:
        """The tokenisation drafts come from: ``ids`` cover the text from byte ``start`` on."""
        self._ids = ids
        self._starts = list(accumulate((len(self.vocab.piece(t)) for t in ids), initial=start))
        self._end = self._starts.pop()

    def forget_tokens(self, cursor: int) -> None:
        """The model split the text differently from the cursor's token: re-tokenise from there."""
        self._set_tokens([], cursor)

    def tokens_at(self, cursor: int, n: int) -> list[int]:
        """Up to ``n`` draft tokens that spell the text from ``cursor`` on (re-tokenising the text from
        the cursor when it falls inside a token, or the tokens run out)."""
        if n <= 0 or not 0 <= cursor < len(self.text):
            return []
        i = bisect_left(self._starts, cursor)
        if not (i < len(self._starts) and self._starts[i] == cursor and (
                i + n <= len(self._ids) or self._end == len(self.text))):
            window_end = char_boundary(self.text, cursor + max(64, n * self.window_bytes_per_token))
            ids = self.vocab.encode(self.text[cursor:window_end])
            if window_end < len(self.text) and len(ids) > 1:
                ids.pop()  # the window's last token may be cut short by the window
            self._set_tokens(ids, cursor)
            self.retokenised += 1
            i = 0
        return self._ids[i:i + n]

    def anchor(self, tail: bytes, expected: int, min_length: int, window: int | None = None) -> Anchor | None:
        """Where the longest suffix of ``tail`` (≥ ``min_length`` bytes) occurs with text after it,
        nearest to ``expected`` (ties: forward); only within ``window`` bytes of it when given."""
        low_bound, limit = 0, len(self.text) - 1  # an occurrence must leave at least one byte to draft
        if window is not None:
            low_bound, limit = max(0, expected - window - len(tail)), min(limit, expected + window)
        if min_length > len(tail) or self.text.find(tail[-min_length:], low_bound, limit) < 0:
            return None
        low, high = min_length, len(tail)
        while low < high:
            middle = (low + high + 1) // 2
            if self.text.find(tail[-middle:], low_bound, limit) >= 0:
                low = middle
            else:
                high = middle - 1
        needle = tail[-low:]
        expected_start = max(low_bound, min(expected - low, limit))
        forward = self.text.find(needle, expected_start, limit)
        backward = self.text.rfind(needle, low_bound, min(limit, expected_start + low - 1))
        found = [s for s in (forward, backward) if s >= 0]
        start = min(found, key=lambda s: (abs(s - expected_start), s < expected_start))
        return Anchor(start + low, low, len(set(found)) > 1)
