"""A tiny multi-turn verifiers environment for platoon's tests: guess a number.

The env plays the user: after each guess it answers `higher`, `lower` or `right`, for at most
four guesses. `found` (weight 1) is 1 when a guess was right; `few_guesses` (weight 0.5) is
1 - (guesses - 1) / 4.
"""

import verifiers.v1 as vf

SECRETS = [3, 6]
MAX_GUESSES = 4


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def found(self, trace) -> float:
        return float(trace.info.get("found", False))

    @vf.reward(weight=0.5)
    async def few_guesses(self, trace) -> float:
        return 1.0 - (trace.info.get("guesses", MAX_GUESSES) - 1) / MAX_GUESSES


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in SECRETS:
            yield GuessTask(
                GuessData(
                    id=f"guess-{secret}",
                    prompt="I picked a number from 1 to 9. Guess it: reply with one number.",
                    secret=secret,
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        guesses, found = 0, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                reply = segment.last_reply.strip()
                guess = int(reply) if reply.isdigit() else -1
                if guess == task.data.secret:
                    found = True
                    break
                if guesses >= MAX_GUESSES:
                    break
                hint = "higher" if guess < task.data.secret else "lower"
                segment = await interaction.turn(hint)
            # before the interaction closes: closing scores the trace with the task's rewards
            interaction.trace.info.update(guesses=guesses, found=found)


__all__ = ["GuessEnv", "GuessTaskset"]
