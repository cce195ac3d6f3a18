"""The request pipeline from a payload to results: the scorer contract (``scorer``), one
scorer in one worker (``runtime``), the dynamic batcher (``batching``), a burst's memory
given back (``memory``) and the Prometheus metrics (``metrics``).

Imports ``common.imaging``, ``common.models``, ``common.configuration`` and
``common.limits``; never the HTTP server or the set-up."""
