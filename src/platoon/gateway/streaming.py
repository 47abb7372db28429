"""Sampled tokens as text a client may see early, and clients' stop sequences.

A streamed reply must add up to the reply the gateway sends at the end, whose content is what
the renderer parses out of the whole completion (tool calls and reasoning taken out, whitespace
trimmed). So `TextStream` lets text out only while it cannot change meaning: it holds back
whitespace at either end, anything that may be the start of a marker (a tool call, a reasoning
block, a stop sequence), and stops letting text out at the first marker; the rest goes at the
end. A stop sequence ends the completion where it appears: `find_stop` says where.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Stop", "TextStream", "find_stop", "tokens_through"]


class Stop:
    """A stop sequence found in a completion's text.

    `sequence` is None for the gateway's own stop after the first tool call (parallel calls
    off), which keeps its text; a client's stop sequence is cut from the text, as the APIs do.
    """

    def __init__(self, start: int, end: int, sequence: str | None) -> None:
        self.start = start
        self.end = end
        self.sequence = sequence

    @property
    def kept(self) -> int:
        """How much of the text the reply keeps."""
        return self.end if self.sequence is None else self.start


def find_stop(text: str, stops: Sequence[str], after_first_call: str | None) -> Stop | None:
    """The earliest stop in `text`: a client's stop sequence, or the end of the first tool call
    (`after_first_call`, the parser's closing marker) when parallel tool calls are off."""
    best: Stop | None = None
    for sequence in stops:
        at = text.find(sequence)
        if at != -1 and (best is None or at < best.start):
            best = Stop(at, at + len(sequence), sequence)
    if after_first_call:
        at = text.find(after_first_call)
        if at != -1 and (best is None or at < best.start):
            best = Stop(at, at + len(after_first_call), None)
    return best


def tokens_through(decode: Callable[[list[int]], str], tokens: Sequence[int], chars: int) -> int:
    """The fewest leading tokens whose text (`decode`) reaches `chars` characters (binary search)."""
    low, high = 0, len(tokens)
    while low < high:
        mid = (low + high) // 2
        if len(decode(list(tokens[:mid]))) >= chars:
            high = mid
        else:
            low = mid + 1
    return low


class TextStream:
    """Turns sampled tokens, fed as they come, into content deltas that are safe to send.

    `markers` are strings whose appearance means the text is no longer plain content (the tool
    call parser's opening tag, reasoning tags); `stops` the client's stop sequences. Once either
    appears, no more deltas: `stop` then tells the caller whether to stop sampling.
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        *,
        markers: Sequence[str],
        stops: Sequence[str],
        after_first_call: str | None,
        stop_token_ids: Sequence[int],
        plain: bool = True,
    ) -> None:
        self.decode = decode  # the renderer's: its tokenizer's decoding, special tokens kept
        self.markers = [m for m in markers if m]
        self.stops = list(stops)
        self.after_first_call = after_first_call
        self.stop_token_ids = set(stop_token_ids)
        self.tokens: list[int] = []
        self.text = ""
        self.sent = ""
        self.stop: Stop | None = None
        self._paused = not plain  # a parser that reads whole replies (JSON calls): no early text
        self._ended = False
        self._prefix = 0  # incremental detokenization: text is decoded from here
        self._read = 0

    def feed(self, tokens: Sequence[int]) -> str:
        """Take newly sampled tokens; return the content delta that may be sent now."""
        if self._ended:
            return ""
        for token in tokens:
            if token in self.stop_token_ids:
                self._ended = True
                break
            self.tokens.append(token)
        self._decode()
        self.stop = find_stop(self.text, self.stops, self.after_first_call)
        if self._paused:
            return ""
        limit = len(self.text)
        cuts = [self.text.find(m) for m in [*self.markers, *self.stops] if m in self.text]
        if self.stop is not None:
            cuts.append(self.stop.start)
        if cuts:
            limit = min(cuts)
            self._paused = True
        else:
            limit -= self._partial_marker()
        safe = self.text[:limit].lstrip().rstrip()
        if not safe.startswith(self.sent):
            self._paused = True
            return ""
        delta = safe[len(self.sent) :]
        self.sent = safe
        return delta

    def rest(self, content: str) -> str:
        """The last delta, given the reply's final content; empty if the deltas sent so far are
        not its beginning (they never are not, for the built-in renderers)."""
        if not content.startswith(self.sent):
            return ""
        delta = content[len(self.sent) :]
        self.sent = content
        return delta

    def _decode(self) -> None:
        # Decode from a little before the new tokens so multi-token characters come out whole.
        before = self.decode(self.tokens[self._prefix : self._read])
        after = self.decode(self.tokens[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self.tokens)

    def _partial_marker(self) -> int:
        """Characters at the end of the text that may begin a marker or a stop sequence."""
        longest = 0
        for marker in [
            *self.markers,
            *self.stops,
            *([self.after_first_call] if self.after_first_call else []),
        ]:
            for n in range(min(len(marker) - 1, len(self.text)), longest, -1):
                if self.text.endswith(marker[:n]):
                    longest = n
                    break
        return longest
