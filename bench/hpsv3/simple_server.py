"""The baseline: HPSv3 served the simplest way, one forward pass per request.

One sync gunicorn worker, everything on the request path: ``gunicorn -w 1 -k sync -b
127.0.0.1:PORT bench.hpsv3.simple_server:app`` with ``SCORER_HPSV3_MODEL``,
``SCORER_HPSV3_BASE``, ``SCORER_HPSV3_PRECISION`` and ``DEVICE`` in the environment. The same
model code, input and formula as the service (``HPSv3Scorer.prepare_images`` and ``score``), so the
difference measured is the serving alone.
"""

from __future__ import annotations

import os

from bench.common import pickle_image_app
from common.configuration.settings import CoreSettings
from services.hpsv3.scorer import HPSv3Scorer

scorer = HPSv3Scorer(CoreSettings(service="hpsv3"))
scorer.setup(os.environ.get("DEVICE", "cpu"))
app = pickle_image_app(
    lambda images, prompts: [r.score for r in scorer.score(scorer.prepare_images(images, prompts, {}))]
)
