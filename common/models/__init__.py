"""What several scorers share about their models: where weights come from (``hub``), the
precision a model runs in (``precision``), a scorer's model loaded in its worker
(``loading``), Qwen2-VL's resize (``qwen_resize``) and the OCR
reward rule of the OCR service and the judge (``ocr_rule``).

Imports ``common.configuration`` and ``common.limits`` only."""
