"""Reference HPSv3 scores for the tests, computed the way HPSv3's own inference computes them.

HPSv3's inferencer (``hpsv3.inference.HPSv3RewardInferencer``; VeRL-Omni's
``verl_omni/utils/reward_score/hpsv3_reward.py`` is the same code on transformers 5) cannot be
vendored here, and its wheel pins transformers 4.45.2 beside deepspeed and diffusers. This is
its computation restated on the libraries it calls: ``AutoProcessor`` for the base (with
torchvision, the default image processor), right padding, the ``<|Reward|>`` token added and
the embeddings resized, ``Qwen2VLForConditionalGeneration`` with the RankNet head loaded with
``strict=True``, the messages built with ``min_pixels = max_pixels = 256 x 28 x 28``, the image
resized by Qwen2-VL's smart resize (bicubic), the processor's padded batch, the head over every
position and the outputs taken where ``input_ids`` is the reward token. The smart resize is
Qwen2-VL's own, as transformers publishes it; shared with the service (``services/hpsv3/inputs.py``):
HPSv3's instruction text and its reward token, which are data, not arithmetic.

``{"job": "verl-omni", "file": PATH, ...}`` runs VeRL-Omni's module itself (fetched by hand; it
is not part of this repository), with a stand-in for its one ``verl`` import, in float32
(``SCORER_TEST_VERL_OMNI_HPSV3`` names the file for ``tests/test_hpsv3.py``).

Runs in the reference environment (``.venv-reference``; ``run.sh test`` builds it and sets
``SCORER_TEST_REFERENCE_PYTHON``). Reads one JSON job on stdin (``checkpoint``, ``base``,
``images``: paths, ``prompts``), writes ``{"mu": [...], "sigma": [...]}`` on stdout.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.hpsv3.inputs import INSTRUCTION, REWARD_SUFFIX, REWARD_TOKEN

# HPSv3's vision input: min_pixels = max_pixels = 256 tokens of 28 x 28 pixels.
FACTOR = 28
PIXELS = 256 * FACTOR * FACTOR


def hpsv3(checkpoint: str, base: str, images: list[Image.Image], prompts: list[str]) -> tuple[list, list]:
    from transformers import AutoConfig, AutoProcessor, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    processor = AutoProcessor.from_pretrained(base, padding_side="right")
    processor.tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
    reward_id = processor.tokenizer.convert_tokens_to_ids(REWARD_TOKEN)
    config = AutoConfig.from_pretrained(base)
    model = Qwen2VLForConditionalGeneration(config).float()  # built in the config's dtype (bfloat16)
    model.resize_token_embeddings(len(processor.tokenizer))
    hidden = config.text_config.hidden_size
    head = torch.nn.Sequential(
        torch.nn.Linear(hidden, 1024),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.05),
        torch.nn.Linear(1024, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )
    state = load_file(checkpoint)
    if not any(key.startswith("model.language_model.") for key in state):  # transformers 4.45's names
        state = {
            ("model." + key if key.startswith("visual.") else key.replace("model.", "model.language_model.", 1)): value
            for key, value in state.items()
        }
    head.load_state_dict({k.removeprefix("rm_head."): v for k, v in state.items() if k.startswith("rm_head.")})
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("rm_head.")}, strict=True)
    model.eval()
    head.eval()

    messages, resized = [], []
    for image, prompt in zip(images, prompts):
        height, width = smart_resize(image.height, image.width, factor=FACTOR, min_pixels=PIXELS, max_pixels=PIXELS)
        resized.append(image.convert("RGB").resize((width, height), Image.BICUBIC))
        content = [
            {"type": "image", "image": image, "min_pixels": PIXELS, "max_pixels": PIXELS},
            {"type": "text", "text": INSTRUCTION.format(text_prompt=prompt) + REWARD_SUFFIX},
        ]
        messages.append([{"role": "user", "content": content}])
    batch = processor(
        text=processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        images=resized,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        states = model.model(**batch).last_hidden_state
        logits = head(states)
    pooled = logits[batch["input_ids"] == reward_id].view(len(images), -1)
    return pooled[:, 0].tolist(), pooled[:, 1].tolist()


def verl_omni(path: str, checkpoint: str, base: str, images: list[Image.Image], prompts: list[str]) -> tuple:
    """VeRL-Omni's ``_HPSv3Inferencer`` as its reward calls it, in float32."""
    verl = types.ModuleType("verl")
    utils = types.ModuleType("verl.utils")
    device = types.ModuleType("verl.utils.device")
    device.get_device_name = lambda: "cpu"  # type: ignore[attr-defined]
    sys.modules.update({"verl": verl, "verl.utils": utils, "verl.utils.device": device})
    module = types.ModuleType("hpsv3_reward")
    # Its model.to(torch.bfloat16) also rounds the rotary frequencies, which a cast back to
    # float32 would not undo: run it in float32 from the start.
    source = Path(path).read_text().replace("torch.bfloat16", "torch.float32")
    exec(compile(source, path, "exec"), module.__dict__)
    inferencer = module._HPSv3Inferencer(checkpoint, base_config=base, device="cpu")
    rewards = inferencer.reward(images, prompts)
    return rewards[:, 0].tolist(), rewards[:, 1].tolist()


def main() -> None:
    torch.set_num_threads(1)
    job = json.load(sys.stdin)
    images = [Image.open(path).convert("RGB") for path in job["images"]]
    if job.get("job") == "verl-omni":
        mu, sigma = verl_omni(job["file"], job["checkpoint"], job["base"], images, job["prompts"])
    else:
        mu, sigma = hpsv3(job["checkpoint"], job["base"], images, job["prompts"])
    json.dump({"mu": mu, "sigma": sigma}, sys.stdout)


if __name__ == "__main__":
    main()
