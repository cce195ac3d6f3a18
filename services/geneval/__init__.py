"""GenEval: compositional correctness of a generated image (objects, counts, colours, positions)."""
