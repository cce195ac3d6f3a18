"""Shared core of the scorer services, in packages that import downward only (lowest first):
``limits`` (deadlines, byte budget, slots, clients, errors), ``configuration`` (settings, GPUs,
CPUs), ``sdk`` (the wire formats and the clients), ``models`` (what scorers share about their
models), ``imaging`` (image input), ``pipeline`` (the scorer contract, runtime, batcher,
metrics), ``setup`` (the registry and what ``run.sh`` reads), ``server`` (the HTTP server).
docs/ARCHITECTURE.md §1 maps each module; tests/test_imports.py keeps the layers."""

__version__ = "0.1.0"
