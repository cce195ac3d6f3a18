"""The baseline: PickScore served the simplest way, flow_grpo's scorer behind Flask.

One sync gunicorn worker, one forward pass of both towers per request, everything on the
request path: ``gunicorn -w 1 -k sync -b 127.0.0.1:PORT bench.clip.simple_server:app`` with
``MODEL_DIR``, ``DEVICE`` and ``PRECISION`` in the environment. Same model, processor and
formula as the service, so the difference measured is the serving alone.
"""

from __future__ import annotations

import os

from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

from bench.common import pickle_image_app
from common.models.precision import torch_dtype
from services.clip.towers import image_features, normalised, text_features

device = os.environ.get("DEVICE", "cpu")
dtype = torch_dtype(os.environ.get("PRECISION", "float16"), device)
model = CLIPModel.from_pretrained(os.environ["MODEL_DIR"], dtype=dtype).to(device).eval()
image_processor = CLIPImageProcessorPil.from_pretrained(os.environ["MODEL_DIR"])
tokenizer = CLIPTokenizer.from_pretrained(os.environ["MODEL_DIR"])


def score(images: list[Image.Image], prompts: list[str]) -> list[float]:
    pixels = image_processor(images=images, return_tensors="pt")["pixel_values"].to(device, dtype)
    texts = tokenizer(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    image_embs = normalised(image_features(model, pixels))
    text_embs = normalised(text_features(model, texts["input_ids"].to(device), texts["attention_mask"].to(device)))
    return (model.logit_scale.float().exp() * (text_embs @ image_embs.T).diag() / 26).tolist()


app = pickle_image_app(score)
