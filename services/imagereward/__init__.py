"""ImageReward-v1.0: human preference of a generated image for its prompt (BLIP + MLP head)."""
