"""Scripted policies for tests and demos (see `platoon.policy.scripted`, where they live)."""

from platoon.policy.scripted import Script, ScriptedSampler, ScriptedSamplerFactory

__all__ = ["Script", "ScriptedSampler", "ScriptedSamplerFactory"]
