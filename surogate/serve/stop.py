"""Stop strings: end the answer at the first one, and never let a client see any of it.

Text arrives in deltas, and a stop string can span two of them (or many tokens). So while
streaming we hold back the longest tail of the text that is still the start of some stop
string; it is released once the next text shows it is not, and cut when it is (vLLM #3574,
SGLang PR #11462: emitted tokens that began a stop string leaked). With
``include_stop_str_in_output`` the matched string is emitted too.
"""

from __future__ import annotations

from collections.abc import Sequence

from surogate.serve.parsers.base import held_prefix


class StopMatcher:
    def __init__(self, stop: Sequence[str] = (), include_in_output: bool = False):
        self.stop = tuple(s for s in stop if s)
        self.include_in_output = include_in_output
        self.matched: str | None = None
        self._held = ""

    def push(self, text: str) -> str:
        """Text that is safe to emit now; after a match, ``matched`` names the stop string."""
        if self.matched is not None:
            return ""
        if not self.stop:
            return text
        text = self._held + text
        hit, at = None, len(text)
        for s in self.stop:
            i = text.find(s, 0, at + len(s) - 1)  # earliest start wins; ties go to the first listed
            if 0 <= i < at:
                hit, at = s, i
        if hit is not None:
            self.matched, self._held = hit, ""
            return text[:at + len(hit)] if self.include_in_output else text[:at]
        keep = max((held_prefix(text, s) for s in self.stop), default=0)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def flush(self) -> str:
        """Generation ended without a match: the held tail was ordinary text."""
        held, self._held = self._held, ""
        return held

