"""Reference scores for the ImageReward tests, computed by the ``image-reward`` package itself
(``RM.load`` on a checkpoint file, ``score`` and ``inference_rank``, as flow_grpo calls them).

Runs in its own environment (``.venv-reference-imagereward``: image-reward 1.5 on the
transformers 4 it needs; ``run.sh test`` builds it and sets ``SCORER_TEST_IMAGEREWARD_PYTHON``),
never in the service's, and imports nothing of this project. The package's tokenizer is
``BertTokenizer.from_pretrained("bert-base-uncased")``: offline, that name is a directory in
the job's ``workdir``, where the job runs. Reads one JSON job on stdin, writes JSON on stdout:

``{"workdir": W, "checkpoint": F, "med_config": F, "images": [paths], "prompts": [...]}``:
``{"shapes": {key: shape}, "score": [...], "rank": [...], "tokens": [[...]]}``: the state dict
of the package's ``ImageReward`` module, each image with its prompt through ``score`` and
through ``inference_rank(prompt, [image])`` (flow_grpo's call), and the package's token ids of
each prompt.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # the tokenizer is a local directory; nothing downloads

import torch
from PIL import Image


def score(checkpoint: str, med_config: str, images: list[str], prompts: list[str]) -> dict:
    import ImageReward as RM

    model = RM.load(checkpoint, device="cpu", med_config=med_config)
    with torch.no_grad():
        scores = [model.score(prompt, Image.open(path)) for path, prompt in zip(images, prompts)]
        ranked = [model.inference_rank(prompt, [Image.open(path)])[1] for path, prompt in zip(images, prompts)]
    shapes = {key: list(tensor.shape) for key, tensor in model.state_dict().items()}
    tokens = [
        model.blip.tokenizer(prompt, padding="max_length", truncation=True, max_length=35)["input_ids"]
        for prompt in prompts
    ]
    return {"shapes": shapes, "score": scores, "rank": ranked, "tokens": tokens}


def main() -> None:
    torch.set_num_threads(1)
    job = json.load(sys.stdin)
    os.chdir(job["workdir"])
    with contextlib.redirect_stdout(sys.stderr):  # the package prints as it loads
        answer = score(job["checkpoint"], job["med_config"], job["images"], job["prompts"])
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
