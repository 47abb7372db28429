"""A tiny verifiers taskset for platoon's tests: three sums, two reward functions.

`correct` (weight 1) is 1 when the reply is the sum; `brief` (weight 0.5) is 1 when the reply
is at most 8 characters. A reply of exactly the sum scores 1.5.
"""

import verifiers.v1 as vf

SUMS = [(2, 3), (4, 5), (10, 7)]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return 1.0 if trace.last_reply.strip() == self.data.answer else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        return 1.0 if len(trace.last_reply.strip()) <= 8 else 0.0


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a, b in SUMS:
            yield SumTask(
                SumData(
                    id=f"sum-{a}-{b}",
                    prompt=f"What is {a} + {b}? Reply with the number only.",
                    answer=str(a + b),
                ),
                self.config.task,
            )


__all__ = ["SumTaskset"]
