"""When a request's samples run: ``admission`` (admitted by what the node really does, each
sample's plan) and ``cancelling`` (a hung-up client's work stopped)."""
