"""`verifiers`: a verifiers environment's own harness plays the episode (`service: verifiers://ENV_ID`).

The episode runs in the environment's worker (`platoon.envs.verifiers`): this harness hands the
agent's env session its gateway URL and key in an `AgentProcessRequested` (whose payload the
event log redacts), waits for the episode to end, and counts its model calls on the budget.
Every call of verifiers' harness goes through that gateway, so its tokens are recorded and
trained like any other agent's.
"""

from __future__ import annotations

import json

from platoon.bus.events import AgentProcessRequested
from platoon.harness.command import count_model_calls
from platoon.harness.context import AgentContext, AgentResult
from platoon.harness.registry import harness

__all__ = ["verifiers"]


async def _install() -> None:
    """The verifiers worker's venv, built into the site cache ahead of any config naming it."""
    # only `platoon harness install verifiers` loads the envs package's venv module
    from platoon.config import load_site
    from platoon.envs.verifiers.venv import build_venv

    site = load_site()
    await build_venv((), site.cache, site.pythons)


@harness("verifiers", install=_install)
async def verifiers(ctx: AgentContext) -> AgentResult:
    """The verifiers environment's own harness, run by its worker against this agent's gateway."""
    if not ctx.gateway_url:
        return AgentResult("error", reason="the gateway does not serve HTTP, which verifiers' harness needs")
    payload = {"argv": [], "env": {"OPENAI_BASE_URL": ctx.gateway_url, "OPENAI_API_KEY": ctx.api_key}}
    seconds = ctx.budget.seconds_left()
    request = AgentProcessRequested(
        episode_id=ctx.episode_id,
        agent_id=ctx.agent_id,
        env=ctx.task.env,
        payload=json.dumps(payload),
        timeout=seconds,
    )
    async with count_model_calls(ctx):
        reply = await ctx.bus.request(request, timeout=None)
    final = reply.stdout or None
    if reply.unsupported:
        return AgentResult(
            "error", reason="harness verifiers plays only a verifiers environment (verifiers://)"
        )
    if reply.timed_out:
        return AgentResult("timeout", final, reply.error)
    if reply.return_code is None:
        return AgentResult("error", final, reply.error or "the verifiers episode did not run")
    if reply.return_code != 0:
        return AgentResult(
            "error", final, f"the verifiers episode failed: {reply.stderr or 'no reason given'}"
        )
    return AgentResult("completed", final)
