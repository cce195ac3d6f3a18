"""The ``multi`` service: several image rewards in one call, one upload and one decode per image."""
