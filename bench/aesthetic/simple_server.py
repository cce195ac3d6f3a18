"""The baseline: the simplest aesthetic server a user would write (deepgen_rl's style).

One sync gunicorn worker, one forward pass per request, everything on the request path:
``gunicorn -w 1 -k sync -b 127.0.0.1:PORT bench.aesthetic.simple_server:app`` with
``CLIP_DIR``, ``HEAD_PATH``, ``DEVICE`` and ``PRECISION`` in the environment. Same model, same
preprocessing as the service, so the difference measured is the serving alone.
"""

from __future__ import annotations

import os

import torch
from PIL import Image
from transformers import AutoImageProcessor, CLIPModel

from bench.common import pickle_image_app
from common.models.precision import torch_dtype
from services.aesthetic.model import AestheticHead, image_features

device = os.environ.get("DEVICE", "cpu")
dtype = torch_dtype(os.environ.get("PRECISION", "float16"), device)
clip = CLIPModel.from_pretrained(os.environ["CLIP_DIR"], dtype=dtype).to(device).eval()
processor = AutoImageProcessor.from_pretrained(os.environ["CLIP_DIR"])
head = AestheticHead()
head.load_state_dict(torch.load(os.environ["HEAD_PATH"], map_location="cpu", weights_only=True))
head = head.to(device).eval()


def score(images: list[Image.Image], prompts: list[str]) -> list[float]:
    pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(device, dtype)
    embeddings = image_features(clip, pixels).float()
    embeddings = embeddings / embeddings.norm(dim=-1, keepdim=True)
    return head(embeddings).squeeze(-1).tolist()


app = pickle_image_app(score)
