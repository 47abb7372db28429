"""Logging, metrics sinks and progress display."""
