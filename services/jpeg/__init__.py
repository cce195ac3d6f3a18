"""flow_grpo's JPEG rewards: the size of an image saved as JPEG, compressibility and incompressibility."""
