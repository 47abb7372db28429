"""An agent's last prompt, kept so that its next one tokenizes only the chunks that changed.

A renderer's prompt is the concatenation of its chunks' tokens, each chunk tokenized on its own
(or, for an assistant turn sampled before, its sampled tokens). So where a call's leading chunks
are the previous call's (the same text, the same sampled tokens), their tokens are the previous
prompt's leading tokens, taken as one slice: what a full render gives, token for token, by
construction. An agent's calls usually repeat its history, so most of each prompt is reused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Chunk", "RenderMemo"]

Chunk = tuple[str, Sequence[int] | None]  # a chunk's text, and the tokens sampled for it (or None)


class RenderMemo:
    """The last prompt rendered for one agent: its chunks, where each ended, and its tokens.

    The prompt a render returns is also the one the next render slices from: it must not be
    changed. Each render replaces the whole record at once, so renders on worker threads may
    interleave (each reads one record, whole).
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (the renderer, its chunks, each chunk's end in the tokens, the tokens)
        self._last: tuple[object, list[Chunk], list[int], list[int]] | None = None

    def tokens(
        self,
        owner: object,
        chunks: list[Chunk],
        encode: Callable[[str], Sequence[int]],
        segment: Callable[[Sequence[int]], Sequence[int]],
    ) -> list[int]:
        """The prompt of `chunks` as `owner` (a renderer) tokenizes them: `encode` for a text,
        `segment` for sampled tokens; the leading chunks the last render shared are not redone."""
        last = self._last
        start = 0
        if last is not None and last[0] is owner:
            _, before, before_ends, before_tokens = last
            most = min(len(before), len(chunks))
            while start < most and before[start] == chunks[start]:
                start += 1
            ends = before_ends[:start]
            tokens = before_tokens[: ends[-1]] if start else []
        else:
            ends, tokens = [], []
        for text, sampled in chunks[start:] if start else chunks:
            tokens += encode(text) if sampled is None else segment(sampled)
            ends.append(len(tokens))
        self._last = (owner, chunks, ends, tokens)
        return tokens
