"""The compacting program: a single agent whose history is summarized when it grows too long.

`program: compacting` with `program_options: {compact_at_tokens: 6000}` plays the task as the
single-agent program does, through a `CompactingContext`: once a call's prompt passed the
threshold, the model summarizes the conversation (an `aux` call, trained, not counted against
the budget) and the agent continues from the instruction and the summary. Recursive agents
compact with `program: recursive` and `program_options: {compaction: {compact_at_tokens: ...}}`.
"""

from platoon.harness import AgentResult
from platoon.harness.compaction import CompactingContext, CompactionOptions
from platoon.programs.registry import Episode, play_steps, program

__all__ = ["compacting"]


@program("compacting", options=CompactionOptions)
async def compacting(episode: Episode) -> AgentResult:
    return await play_steps(episode.harness, CompactingContext(episode.root, episode.options))
