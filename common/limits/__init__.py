"""What bounds a request and shares a worker out: its deadline (``deadlines``), the bytes of
work it holds (``budget``), a slot at a stage (``slots``), its client for fairness
(``clients``), and the error each bound answers with, carrying its HTTP status (``errors``).

The bottom layer: standard library only, imports nothing else of ``common``."""
