"""Stop sequences over streamed text: cut exactly at the first one, wherever the chunks split it.

Pure text logic (no tokens, no transport). A generation's text arrives in pieces (one
per round, or per token); ``StopCutter.push`` returns the part of each piece that is
certainly output and holds back the tail that might still grow into a stop sequence
("Hello\\nUs" while "\\nUser:" is a stop). When a stop sequence completes, the text
before it is released, the stop itself and everything after it never are, and
``matched`` names it. ``flush`` releases what was held back once the text has ended.

The stop that ends the text is the one a character-by-character reader meets first:
the occurrence that *ends* earliest (ties: the longer one, which starts earlier). The
result therefore depends only on the whole text, never on how it was split.

Text pushed with ``armed=False`` (the first min_tokens tokens' text, as vLLM's min_tokens
has it) is never where a stop sequence ends: an occurrence counts only if it ends in
text pushed armed, though it may begin earlier.
"""
from __future__ import annotations

from typing import Sequence

MAX_STOPS = 16           # stop sequences per request
MAX_STOP_CHARS = 512     # characters per stop sequence


def check_stops(stops: Sequence[str]) -> str | None:
    """What is wrong with ``stops`` as a request's stop sequences (None: nothing)."""
    if len(stops) > MAX_STOPS:
        return f"at most {MAX_STOPS} stop sequences, got {len(stops)}"
    for i, stop in enumerate(stops):
        if not isinstance(stop, str):
            return f"stop sequence {i} is not a string"
        if not stop:
            return f"stop sequence {i} is empty"
        if len(stop) > MAX_STOP_CHARS:
            return f"stop sequence {i} has {len(stop)} characters, the limit is {MAX_STOP_CHARS}"
    return None


def find_stop(text: str, stops: Sequence[str], after: int = 0) -> tuple[int, str] | None:
    """(index, stop) of the stop occurrence in ``text`` that ends first (ties: the longer) past its first
    ``after`` characters; None if none."""
    best: tuple[int, int, str] | None = None   # (end, -length, stop)
    for stop in stops:
        index = text.find(stop, max(0, after - len(stop) + 1))
        if index >= 0:
            key = (index + len(stop), -len(stop), stop)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    end, negative_length, stop = best
    return end + negative_length, stop


def held_tail(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop (what must wait)."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


class StopCutter:
    """Streamed text in, output text out, cut before the first stop sequence (see the module doc)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(dict.fromkeys(stops))   # in order, without repeats
        self.matched: str | None = None            # the stop sequence that ended the text, once one has
        self._held = ""                            # text that may be the start of a stop sequence
        self._blind = 0                            # leading characters of _held pushed unarmed

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, piece: str, armed: bool = True) -> str:
        """The output ``piece`` adds: all of it, less a tail that may begin a stop sequence (released by
        a later push or flush), and nothing from a completed stop sequence on. After a stop: always "".
        ``armed=False``: no stop sequence may end within ``piece`` (see the module doc)."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self._held + piece
        found = find_stop(text, self.stops, self._blind) if armed else None
        if found is not None:
            index, self.matched = found
            self._held, self._blind = "", 0
            return text[:index]
        keep = held_tail(text, self.stops)
        released = len(text) - keep
        self._held = text[released:]
        self._blind = keep if not armed else max(0, self._blind - released)
        return text[:released]

    def flush(self) -> str:
        """The text held back, now that no more follows (no stop can complete any more)."""
        held, self._held, self._blind = ("" if self.stopped else self._held), "", 0
        return held
