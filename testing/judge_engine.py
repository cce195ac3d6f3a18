"""A real OpenAI-compatible engine for the judge's tests: ``transformers serve`` (from its own
environment, ``SCORER_TEST_ENGINE_PYTHON``) serving tiny random Qwen2-VL models saved to disk.

A random model's reply is gibberish, the judge's parse-failure path. ``save_judge_model`` with a
``reply`` steers the model instead: the reply is added to the tokenizer as one token, every
decoder layer's output projections are zeroed (each position's residual stays its token's
embedding), and the embeddings and output head make the last prompt token ("\\n" after
``<|im_start|>assistant``) predict the reply's token and that token predict ``<|im_end|>``: the
engine answers exactly ``reply``, through its real chat template, image processor and sampler.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from testing.server import free_port

# The logit of the steered token over every other (zero): certain under any temperature.
STEER = 100.0


def save_judge_model(directory: Path, reply: str | None = None, seed: int = 0) -> Path:
    """A tiny random Qwen2-VL-7B-Instruct layout in ``directory``, answering ``reply`` when given.
    (torch and transformers are imported here: starting the engine needs neither.)"""
    import torch
    from transformers import GenerationConfig, Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from testing.qwen2vl_models import save_base

    save_base(directory)
    if reply is not None:
        tokenizer = Qwen2Tokenizer.from_pretrained(directory)
        tokenizer.add_tokens([reply])
        tokenizer.save_pretrained(directory)
        config_path = directory / "config.json"
        config = json.loads(config_path.read_text())
        config["vocab_size"] = len(tokenizer) + 7
        config_path.write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    config = Qwen2VLConfig.from_pretrained(directory)
    model = Qwen2VLForConditionalGeneration(config).eval()
    if reply is not None:
        with torch.no_grad():
            _steer(model, tokenizer, reply)
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id, bos_token_id=config.text_config.bos_token_id
    )
    model.save_pretrained(directory)
    return directory


def _steer(model: Any, tokenizer: Any, reply: str) -> None:
    """Qwen2-VL ``model`` answering ``reply`` (a token of ``tokenizer``), as the module says."""
    newline = tokenizer.convert_tokens_to_ids("Ċ")  # byte-level BPE's "\n"
    answer = tokenizer.convert_tokens_to_ids(reply)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = model.model.language_model
    for layer in text.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    embed = text.embed_tokens.weight
    embed[newline] = 0
    embed[newline, 0] = 1.0
    embed[answer] = 0
    embed[answer, 1] = 1.0
    head = model.lm_head.weight
    head.zero_()
    # The final RMSNorm scales a one-hot embedding to sqrt(hidden) in its coordinate.
    scale = STEER / model.config.text_config.hidden_size**0.5
    head[answer, 0] = scale
    head[end, 1] = scale


@contextlib.contextmanager
def engine(
    python: str, log: Path, port: int = 0, device: str = "cpu", while_starting: Callable[[], None] | None = None
) -> Iterator[str]:
    """``transformers serve`` on loopback (``port``, or a free one) on ``device``, its models
    loaded on demand by path; yields its base URL once it answers, stopped after.
    ``while_starting`` runs while the engine starts (its imports take seconds)."""
    port = port or free_port()
    command = [python, "-m", "transformers.cli.transformers", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", device]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if while_starting is not None:
            while_starting()
        wait_for_models(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)  # uvicorn waits for kept-alive connections to close
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_models(url: str, process: subprocess.Popen, log: Path, seconds: float = 180.0) -> None:
    """Until the engine answers; its log in the error when it exits or never does."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"the engine exited ({process.returncode}): {log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the engine did not answer /v1/models in {seconds:g} s: {log.read_text()[-3000:]}")
