"""Static-text speculative proposer core: a cursor into the prediction that re-anchors on lines.

Pure Python (no vLLM): the engine adapter feeds it the tokens each step accepted and asks it for
the next drafts. After a divergence the cursor is lost (-1); it is re-anchored only when a context
line completes, by aligning the completed lines with the prediction's lines — so edits that insert,
delete or change lines cost only the lines around the edit, not the rest of the prediction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from cascade.predict.aligner import Aligner, default_aligner

Line = tuple[int, ...]
Mode = Literal["smart", "prefix"]


def normalise_newlines(text: str) -> str:
    """CRLF and lone CR become LF, so a Windows-edited prediction still matches model output."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def newline_token_ids(decoded_vocab: Iterable[tuple[int, str]]) -> frozenset[int]:
    """Tokens whose text contains a newline: the line boundaries of a token sequence."""
    return frozenset(token for token, text in decoded_vocab if "\n" in text)


def split_lines(tokens: Sequence[int], newline_ids: frozenset[int]) -> tuple[list[Line], list[int]]:
    """Complete lines (each ending with a newline token) and their start offsets."""
    lines: list[Line] = []
    starts: list[int] = []
    start = 0
    for i, token in enumerate(tokens):
        if token in newline_ids:
            lines.append(tuple(tokens[start:i + 1]))
            starts.append(start)
            start = i + 1
    if start < len(tokens):
        lines.append(tuple(tokens[start:]))
        starts.append(start)
    return lines, starts


class PredictionState:
    """Per-request proposer state. ``observe`` once per engine step, then ``propose``."""

    def __init__(self, prediction_ids: Sequence[int], newline_ids: frozenset[int], mode: Mode = "smart",
                 aligner: Aligner | None = None, window_lines: int = 8) -> None:
        self.prediction = list(prediction_ids)
        self.newline_ids = newline_ids
        self.mode = mode
        self.aligner = aligner or default_aligner()
        self.window_lines = window_lines
        self.lines, self.line_starts = split_lines(self.prediction, newline_ids)
        self.cursor = 0
        self.context_lines: list[Line] = []
        self.partial: list[int] = []
        self.last_proposal: list[int] = []
        self.proposed = 0
        self.accepted = 0
        self.alignments = 0
        self.reanchors = 0

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted

    def _count_accepted(self, new_tokens: Sequence[int]) -> None:
        """The engine keeps the longest matching prefix of the last draft, then adds a token of its own
        that differs from the next draft token (a rejected draft is never resampled as itself)."""
        for proposed, got in zip(self.last_proposal, new_tokens, strict=False):
            if proposed != got:
                break
            self.accepted += 1
        self.last_proposal = []

    def _extend_context(self, new_tokens: Sequence[int]) -> bool:
        completed = False
        for token in new_tokens:
            self.partial.append(token)
            if token in self.newline_ids:
                self.context_lines.append(tuple(self.partial))
                self.partial = []
                completed = True
        return completed

    def observe(self, new_tokens: Sequence[int]) -> None:
        """The tokens the engine accepted this step (accepted drafts plus its own next token)."""
        self._count_accepted(new_tokens)
        line_completed = self._extend_context(new_tokens)
        if self.cursor >= 0:
            end = self.cursor + len(new_tokens)
            if self.prediction[self.cursor:end] == list(new_tokens):
                self.cursor = end
                return
            self.cursor = -1
        if self.mode == "smart" and line_completed:
            self._realign()

    def _realign(self) -> None:
        self.alignments += 1
        context = self.context_lines[-self.window_lines:]
        index = self.aligner.align(context, self.lines)
        if index is None or index >= len(self.lines):
            return
        line = self.lines[index]
        if tuple(self.partial) == line[:len(self.partial)]:
            self.cursor = self.line_starts[index] + len(self.partial)
            self.reanchors += 1

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` predicted tokens from the cursor; nothing when lost or exhausted."""
        if self.cursor < 0 or k <= 0:
            return []
        draft = self.prediction[self.cursor:self.cursor + k]
        self.last_proposal = draft
        self.proposed += len(draft)
        return draft

    def snapshot(self) -> dict[str, Any]:
        """State for the debug log."""
        return {"cursor": self.cursor, "context_lines": len(self.context_lines), "partial": list(self.partial),
                "proposed": self.proposed, "accepted": self.accepted, "alignments": self.alignments,
                "reanchors": self.reanchors}
