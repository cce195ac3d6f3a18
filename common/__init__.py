"""Shared core of the scorer services: HTTP, wire formats, batching, limits, metrics."""

__version__ = "0.1.0"
