"""Static-text speculative proposer core: a cursor into the prediction's text that re-anchors on lines.

Pure Python (no vLLM). The engine adapter feeds it the tokens each step accepted and asks it for the
next drafts. The cursor is a byte offset into the prediction's text, so the model may write that
text with other token boundaries than the tokenised prediction: the rest of the text is then
re-tokenised from the output's last token boundary. After a divergence the cursor is lost (-1); it
is re-anchored only when an output line completes, by aligning the completed lines with the
prediction's lines, so an edit costs only the lines around it, not the rest of the prediction.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Literal

from cascade.predict.aligner import Aligner, default_aligner
from cascade.predict.draft_length import DraftLength, FixedLength
from cascade.predict.vocabulary import Vocabulary, char_boundary, text_of

Mode = Literal["smart", "prefix"]
NEWLINE = b"\n"


def normalise_newlines(text: str) -> str:
    """CRLF and lone CR become LF, so a Windows-edited prediction still matches model output."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_lines(text: bytes) -> tuple[list[bytes], list[int]]:
    """Lines (each with its newline, the last one may lack it) and their start offsets."""
    lines = text.splitlines(keepends=True)
    starts = [0, *accumulate(len(line) for line in lines)][:len(lines)]
    return lines, starts


class PredictionState:
    """Per-request proposer state. ``observe`` once per engine step, then ``propose``."""

    def __init__(self, prediction_ids: Sequence[int], vocab: Vocabulary, mode: Mode = "smart",
                 aligner: Aligner | None = None, lengths: DraftLength | None = None, window_lines: int = 8,
                 window_bytes_per_token: int = 8) -> None:
        self.vocab = vocab
        self.mode = mode
        self.aligner = aligner or default_aligner()
        self.lengths = lengths or FixedLength(8)
        self.window_lines = window_lines
        self.window_bytes_per_token = window_bytes_per_token
        ids = [t for t in prediction_ids if vocab.piece(t)]
        self.text = text_of(vocab, ids)
        self.lines, self.line_starts = split_lines(self.text)
        self.cursor = 0
        self._set_tokens(ids, 0)
        self.context_lines: list[bytes] = []
        self.partial = b""
        self.last_proposal: list[int] = []
        self.proposed = 0
        self.accepted = 0
        self.alignments = 0
        self.reanchors = 0
        self.retokenised = 0
        self.failed_reanchors = 0
        self._skip_alignments = 0
        self._just_reanchored = False
        self.lost_line = -1

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted

    def _set_tokens(self, ids: list[int], start: int) -> None:
        """The tokenisation drafts come from: ``ids`` cover the text from byte ``start`` on."""
        self._ids = ids
        self._starts = list(accumulate((len(self.vocab.piece(t)) for t in ids), initial=start))
        self._end = self._starts.pop()

    def _count_accepted(self, new_tokens: Sequence[int]) -> int:
        """The engine keeps the longest matching prefix of the last draft, then adds a token of its own
        that differs from the next draft token (a rejected draft is never resampled as itself)."""
        accepted = 0
        for proposed, got in zip(self.last_proposal, new_tokens, strict=False):
            if proposed != got:
                break
            accepted += 1
        self.accepted += accepted
        return accepted

    def _extend_context(self, data: bytes) -> bool:
        lines = (self.partial + data).split(NEWLINE)
        self.partial = lines.pop()
        self.context_lines += [line + NEWLINE for line in lines]
        return bool(lines)

    def observe(self, new_tokens: Sequence[int]) -> None:
        """The tokens the engine accepted this step (accepted drafts plus its own next token)."""
        proposed = len(self.last_proposal)
        accepted = self._count_accepted(new_tokens)
        self.last_proposal = []
        data = text_of(self.vocab, new_tokens)
        line_completed = self._extend_context(data)
        on_track = self.cursor >= 0 and self.text.startswith(data, self.cursor)
        self.lengths.update(proposed, accepted, on_track)
        if self._just_reanchored and proposed:
            self._just_reanchored = False
            self.failed_reanchors = 0 if accepted or on_track else self.failed_reanchors + 1
            self._skip_alignments = (1 << min(self.failed_reanchors, 6)) - 1
        if on_track:
            self.cursor += len(data)
            if accepted < proposed:
                self._set_tokens([], self.cursor)
            return
        if self.cursor >= 0:
            self.lost_line = bisect_right(self.line_starts, self.cursor) - 1
        self.cursor = -1
        if self.mode == "smart" and line_completed:
            self._realign()

    def _realign(self) -> None:
        """Re-anchor after a completed line. After n re-anchors in a row whose first draft token was
        rejected, skip 2**n - 1 completed lines (at most 63) before aligning again: a prediction that
        keeps anchoring falsely stops costing rejected drafts and alignment time."""
        if self._skip_alignments > 0:
            self._skip_alignments -= 1
            return
        self.alignments += 1
        context = self.context_lines[-self.window_lines:]
        index = self.aligner.align(context, self.lines, near=self.lost_line,
                                   fits=lambda i: self.lines[i].startswith(self.partial))
        if index is None:
            return
        self.cursor = self.line_starts[index] + len(self.partial)
        self.reanchors += 1
        self._just_reanchored = True

    def _token_index(self, n: int) -> int:
        """Index of the draft token that starts at the cursor, re-tokenising the text from the cursor
        when the output's last token ended inside a predicted token (or the tokens run out)."""
        i = bisect_left(self._starts, self.cursor)
        if i < len(self._starts) and self._starts[i] == self.cursor and (
                i + n <= len(self._ids) or self._end == len(self.text)):
            return i
        window_end = char_boundary(self.text, self.cursor + max(64, n * self.window_bytes_per_token))
        ids = self.vocab.encode(self.text[self.cursor:window_end])
        if window_end < len(self.text) and len(ids) > 1:
            ids.pop()
        self._set_tokens(ids, self.cursor)
        self.retokenised += 1
        return 0

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` predicted tokens from the cursor (as many as the draft length policy
        allows); nothing when lost or exhausted."""
        n = min(limit, self.lengths.length())
        if self.cursor < 0 or self.cursor >= len(self.text) or n <= 0:
            return []
        i = self._token_index(n)
        draft = self._ids[i:i + n]
        self.last_proposal = draft
        self.proposed += len(draft)
        return draft

    def snapshot(self) -> dict[str, Any]:
        """State for the debug log."""
        return {"cursor": self.cursor, "draft_length": self.lengths.length(),
                "context_lines": len(self.context_lines), "partial": self.partial.decode("utf-8", "replace"),
                "proposed": self.proposed, "accepted": self.accepted, "alignments": self.alignments,
                "reanchors": self.reanchors, "retokenised": self.retokenised}
