"""The import blocks dataset harnesses run before a Python program (a label's ``"prelude"``).

APPS, TACO and LiveCodeBench prepend one to every solution they grade, stdin and call-based
alike, and LeetCode's own Python environment imports the same modules, so those datasets'
accepted solutions may use ``Counter``, ``heappush`` or ``inf`` without importing them. Each
block here is the one its harness states, verbatim (the file and commit are in the README):

- ``apps``: hendrycks/apps ``eval/testing_util.py``; TACO's ``metrics/testing_util.py`` states
  the same block (``taco``);
- ``lcb``: LiveCodeBench ``lcb_runner/evaluation/testing_util.py``'s ``import_string``;
- ``none``: the program as written, as a contest judge runs it.

The sandbox runs the block in the program's namespace before the program, compiled apart
(``inside.program``): the program's line numbers stay its own, ``from __future__`` stays first, and
whatever the program defines replaces what the block bound.
"""

from __future__ import annotations

APPS = (
    "import sys\nimport time\nimport itertools\nfrom itertools import accumulate, product, permutations, combinations\n"
    "import collections\nfrom collections import Counter, OrderedDict, deque, defaultdict, ChainMap\n"
    "from functools import lru_cache\nimport math\n"
    "from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2\nimport fractions\n"
    "from typing import List, Tuple\nimport numpy as np\nimport random\nimport heapq\nfrom heapq import *\n"
)
LCB = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)
PRELUDES = {"none": "", "apps": APPS, "taco": APPS, "lcb": LCB}
# The server's default (``SCORER_CODE_PRELUDE``) ``auto``: per test format, the block of the
# platform the format comes from. Call-based tests are LeetCode's (whose environment and every
# harness above import these names); stdin programs are a contest judge's, assert tests
# HumanEval's and MBPP's, whose harnesses run the program as written.
AUTO = {"call": "lcb", "stdin": "none", "assert": "none"}


def prelude(name: str, kind: str) -> str:
    """The block a label's (else the server's) prelude ``name`` runs before a ``kind`` test's program."""
    return PRELUDES[AUTO[kind] if name == "auto" else name]
