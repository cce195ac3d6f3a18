"""The URL a client asks a ``multi`` service for its rewards by (``rewards_url``): each weight
in the query (``?ocr=0.7&pickscore=0.3``), ``!optional`` after one whose failure only drops it
(services/multi/wanted.py reads it). Standard library only: the VeRL-Omni drop-in imports it in
the trainer's environment."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import quote as url_quote

# A query weight ending with this marks its reward optional: ``?pickscore=0.3!optional``.
OPTIONAL = "!optional"


def rewards_url(url: str, weights: Mapping[str, float] | None = None, optional: Collection[str] = ()) -> str:
    """``url`` with the rewards a ``multi`` service sums in its query (``?ocr=0.7&pickscore=0.3``;
    a reward in ``optional`` gets ``!optional``: its failure drops it instead of failing the
    request). Without ``weights``, the service's own default (every reward it serves, weight 1).
    The path stays as given (``/``, ``/score``, a balancer's prefix); none at all is ``/``."""
    base, _, query = url.partition("?")
    if "/" not in base.partition("://")[2]:
        base += "/"
    if weights:
        unknown = set(optional) - set(weights)
        if unknown:
            raise ValueError(f"optional rewards {sorted(unknown)} have no weight")
        wanted = (
            f"{url_quote(name)}={float(weight)!r}{OPTIONAL if name in optional else ''}"
            for name, weight in weights.items()
        )
        query = "&".join([*filter(None, [query]), *wanted])
    return base + (f"?{query}" if query else "")
