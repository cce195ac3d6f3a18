"""Levenshtein edit distance."""

STATEMENT = """
Given two strings, return the minimum number of single-character insertions, deletions and
substitutions that turn the first into the second. Write
`def edit_distance(a: str, b: str) -> int`.
"""

FN_NAME = "edit_distance"

REFERENCE = """
def edit_distance(a, b):
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]
"""


def cases(rng):
    fixed = [["horse", "ros"], ["intention", "execution"], ["", ""], ["", "abc"], ["same", "same"]]

    def word():
        return "".join(rng.choice("abc") for _ in range(rng.randint(0, 40)))

    return fixed + [[word(), word()] for _ in range(20)]
