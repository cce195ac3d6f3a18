"""What the tests and the benches share: real gunicorn services (``server``), test images and
flow_grpo's OCR prompts (``images``), tiny random models of the real architectures
(``random_clip``, ``clip_models``, ``qwen2vl_models``) and the code verifier's false-negative
corpus with its published harnesses re-stated (``corpus``)."""
