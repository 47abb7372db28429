"""The single-agent program: the harness plays the task with the root agent's context (each step
of a multi-step task in turn)."""

from platoon.harness import AgentResult
from platoon.programs.registry import Episode, play_steps, program


@program("single")
async def single(episode: Episode) -> AgentResult:
    return await play_steps(episode.harness, episode.root)
