"""The HTTP server: the app factory (``app``) and the serving class it routes to (``serving``),
the gunicorn worker (``worker``) and its
request framing (``framing``), the bearer token check (``auth``) and the wire protocols on
the one request path (``protocols``).

The top layer: may import every other package of ``common``; none imports it."""
