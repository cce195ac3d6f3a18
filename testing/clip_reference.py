"""Independent reference scores for the CLIP reward tests, computed with the libraries
flow_grpo's scorers call, in the shape they call them.

Runs in the reference environment (``.venv-reference``: open_clip, torchvision and
transformers; ``run.sh test`` builds it and sets ``SCORER_TEST_REFERENCE_PYTHON``), never in
the service's. Reads one JSON job on stdin, writes JSON on stdout:

- ``{"job": "hpsv2-model", "directory": D, "config": {...}}``: a random open_clip CLIP of that
  configuration saved as HPSv2 ships its checkpoint, plus ``open_clip_config.json``;
- ``{"job": "pickscore" | "clipscore" | "hpsv2", "model": D, "images": [paths], "prompts": [...]}``:
  ``{"scores": [...]}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

HPS_FILE = "HPS_v2.1_compressed.pt"


def pickscore(model_dir: str, images: list[Image.Image], prompts: list[str]) -> list[float]:
    """flow_grpo's PickScore: the processor's images and texts (padded, truncated to 77), normalised
    embeddings, ``logit_scale.exp()`` times their dot product, the diagonal over 26. The PIL image
    processor is the one transformers 4 (flow_grpo's) loads."""
    from transformers import AutoModel, CLIPImageProcessorPil, CLIPTokenizer

    model = AutoModel.from_pretrained(model_dir).eval()
    image_inputs = CLIPImageProcessorPil.from_pretrained(model_dir)(images=images, return_tensors="pt")
    text_inputs = CLIPTokenizer.from_pretrained(model_dir)(
        text=prompts, padding=True, truncation=True, max_length=77, return_tensors="pt"
    )
    with torch.no_grad():
        image_embs = model.get_image_features(**image_inputs).pooler_output
        text_embs = model.get_text_features(**text_inputs).pooler_output
        image_embs = image_embs / image_embs.norm(p=2, dim=-1, keepdim=True)
        text_embs = text_embs / text_embs.norm(p=2, dim=-1, keepdim=True)
        scores = model.logit_scale.exp() * (text_embs @ image_embs.T)
        return (scores.diag() / 26).tolist()


def clipscore(model_dir: str, images: list[Image.Image], prompts: list[str]) -> list[float]:
    """flow_grpo's CLIPScore: float pixels in [0, 1] through torchvision's Resize (bilinear),
    CenterCrop and Normalize built from the processor's configuration; texts padded to 77; the
    ``logits_per_image`` diagonal over 30."""
    import torchvision.transforms as T
    from transformers import CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

    model = CLIPModel.from_pretrained(model_dir).eval()
    config = CLIPImageProcessorPil.from_pretrained(model_dir)
    crop = config.crop_size
    transform = T.Compose(
        [
            T.Resize(config.size["shortest_edge"]),
            T.CenterCrop((crop["height"], crop["width"])),
            T.Normalize(mean=config.image_mean, std=config.image_std),
        ]
    )
    pixels = torch.stack([transform(torch.tensor(np.asarray(image)).permute(2, 0, 1) / 255.0) for image in images])
    texts = CLIPTokenizer.from_pretrained(model_dir)(
        prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt"
    )
    with torch.no_grad():
        outputs = model(pixel_values=pixels, **texts)
        return (outputs.logits_per_image.diagonal() / 30).tolist()


def hpsv2(model_dir: str, images: list[Image.Image], prompts: list[str]) -> list[float]:
    """flow_grpo's HPSv2: the open_clip model with the checkpoint, HPSv2's ``preprocess_val``
    (ToTensor, then Resize bicubic and CenterCrop on the tensor, Normalize), open_clip's
    tokenizer, one pair at a time; the dot product of the normalised features."""
    import open_clip
    import torchvision.transforms as T
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    config = json.loads((Path(model_dir) / "open_clip_config.json").read_text())["model_cfg"]
    model = open_clip.model.CLIP(**config, output_dict=True).eval()
    checkpoint = torch.load(Path(model_dir) / HPS_FILE, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    size = config["vision_cfg"]["image_size"]
    preprocess_val = T.Compose(
        [
            T.ToTensor(),
            T.Resize(size, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(size),
            T.Normalize(mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD),
        ]
    )
    tokenizer = open_clip.tokenizer.SimpleTokenizer()
    scores = []
    with torch.no_grad():
        for image, prompt in zip(images, prompts):
            outputs = model(preprocess_val(image.convert("RGB")).unsqueeze(0), tokenizer([prompt]))
            logits_per_image = outputs["image_features"] @ outputs["text_features"].T
            scores.append(float(torch.diagonal(logits_per_image)[0]))
    return scores


def hpsv2_model(directory: str, config: dict[str, Any]) -> dict[str, str]:
    """A random open_clip CLIP saved as ``{"state_dict": ...}`` (HPSv2's checkpoint layout)."""
    import open_clip

    torch.manual_seed(0)
    model = open_clip.model.CLIP(**config)
    with torch.no_grad():
        model.logit_scale.fill_(4.2)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": model.state_dict()}, out / HPS_FILE)
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": config}))
    return {"checkpoint": str(out / HPS_FILE)}


def main() -> None:
    torch.set_num_threads(1)
    job = json.load(sys.stdin)
    if job["job"] == "hpsv2-model":
        json.dump(hpsv2_model(job["directory"], job["config"]), sys.stdout)
        return
    images = [Image.open(path).convert("RGB") for path in job["images"]]
    scorer = {"pickscore": pickscore, "clipscore": clipscore, "hpsv2": hpsv2}[job["job"]]
    json.dump({"scores": scorer(job["model"], images, job["prompts"])}, sys.stdout)


if __name__ == "__main__":
    main()
