"""Longest common subsequence of two strings."""

STATEMENT = """
Given two strings, return the length of their longest common subsequence (characters taken
in order, not necessarily adjacent). Write
`def longest_common_subsequence(text1: str, text2: str) -> int`.
"""

FN_NAME = "longest_common_subsequence"

REFERENCE = """
def longest_common_subsequence(text1, text2):
    previous = [0] * (len(text2) + 1)
    for a in text1:
        current = [0]
        for j, b in enumerate(text2):
            current.append(previous[j] + 1 if a == b else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]
"""


def cases(rng):
    fixed = [["abcde", "ace"], ["abc", "abc"], ["abc", "def"], ["", "abc"], ["a", "a"]]

    def word():
        return "".join(rng.choice("abcd") for _ in range(rng.randint(0, 60)))

    return fixed + [[word(), word()] for _ in range(20)]
