"""The client side of a scorer: the wire formats both sides speak (``wire``; flow_grpo's numpy
prompts as lists of str: ``numpy_strings``), the Python
client and its CLI (``client``), the one retry policy of every caller (``retry``), the URL of a
``multi`` query (``rewards``) and the VeRL-Omni drop-in (``verl_omni``).

Imported in a trainer's process: imports ``common.limits`` alone, never the server."""
