"""The single-agent program: the harness plays the task with the root agent's context."""

from platoon.harness import AgentResult
from platoon.programs.registry import Episode, program


@program("single")
async def single(episode: Episode) -> AgentResult:
    return await episode.harness.run(episode.root)
