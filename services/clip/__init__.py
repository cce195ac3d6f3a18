"""The CLIP family: weights lookup, preprocessing and text-image reward scorers (PickScore,
CLIPScore, HPSv2) on one model code, shared with the aesthetic service."""
