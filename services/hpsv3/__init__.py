"""HPSv3: a Qwen2-VL reward model of human preference, served (services/hpsv3/README.md)."""
