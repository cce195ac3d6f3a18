"""Length of the longest strictly increasing subsequence."""

STATEMENT = """
Given a list of integers, return the length of its longest strictly increasing subsequence.
Write `def longest_increasing_subsequence(nums: list[int]) -> int`.
"""

FN_NAME = "longest_increasing_subsequence"

REFERENCE = """
from bisect import bisect_left


def longest_increasing_subsequence(nums):
    tails = []
    for x in nums:
        at = bisect_left(tails, x)
        tails[at:at + 1] = [x]
    return len(tails)
"""


def cases(rng):
    fixed = [[[10, 9, 2, 5, 3, 7, 101, 18]], [[]], [[7, 7, 7]], [[1, 2, 3, 4]], [[4, 3, 2, 1]]]
    return fixed + [[[rng.randint(-50, 50) for _ in range(rng.randint(1, 200))]] for _ in range(20)]
