"""Runs inside .venv-deepgym: DeepGym 0.6.2's OpenRLHF router served as DeepGym documents it
(``deepgym/integrations/openrlhf.py``): a FastAPI app with ``create_openrlhf_router`` for the
``coin_change`` environment, local mode (bubblewrap), ``max_parallel`` 32, under uvicorn.

Usage: python deepgym_openrlhf.py PORT  (answers ``POST http://127.0.0.1:PORT/reward/score``)
"""

import sys

import uvicorn
from deepgym.core import DeepGym
from deepgym.integrations.openrlhf import create_openrlhf_router
from deepgym.registry import load_environment
from fastapi import FastAPI

app = FastAPI()
router = create_openrlhf_router(
    load_environment("coin_change"), DeepGym(mode="local"), infra_failure_score="nan", max_parallel=32
)
app.include_router(router)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
