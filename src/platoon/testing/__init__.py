"""Test helpers: scripted policies, tiny tokenizers and tiny models, for tests and demos on CPU."""
