"""The code sandbox: the server's side (``host``: the isolation, the warm zygote, the run slots,
the relay of call-based tests; ``cgroups``: where this node lets a worker make the per-sample
cgroups; ``compile_cache``: the builds of compiled programs, once per source) and what runs
inside it (``inside``: shipped into the sandbox whole, one module per process and trust level)."""
