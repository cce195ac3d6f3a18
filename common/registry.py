"""Which scorer class serves which service name. A new scorer is one module and one line here."""

from __future__ import annotations

import importlib

from common.scorer import Scorer

SCORERS: dict[str, str] = {
    "ocr": "services.ocr.scorer:OCRScorer",
    "aesthetic": "services.aesthetic.scorer:AestheticScorer",
    "code": "services.code.scorer:CodeScorer",
}

DEFAULT_PORTS: dict[str, int] = {"ocr": 18082, "aesthetic": 18080, "code": 18090}


def load_scorer_class(service: str) -> type[Scorer]:
    """Import the scorer class of ``service``; a clear error for an unknown name."""
    try:
        target = SCORERS[service]
    except KeyError:
        raise ValueError(f"unknown service {service!r}; choose one of {', '.join(SCORERS)}") from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)
