"""Tiny random-init models for tests (see `platoon.models.tiny`, where the builder lives)."""

from platoon.models.tiny import save_tiny_model

__all__ = ["save_tiny_model"]
