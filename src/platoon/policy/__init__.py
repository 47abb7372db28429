"""Samplers: where the gateway gets completions from.

Every policy, hosted Tinker, a self-hosted Tinker-API server, the embedded backend or a
scripted test policy, is a `Sampler`: prompt token ids in, sampled token ids and their
logprobs out. The gateway never sees text from a sampler, which is what keeps the trained
tokens exactly the sampled ones.
"""

from platoon.policy.base import SampledCompletion, SampleParams, Sampler, SamplerFactory, StopReason

__all__ = ["SampleParams", "SampledCompletion", "Sampler", "SamplerFactory", "StopReason"]
