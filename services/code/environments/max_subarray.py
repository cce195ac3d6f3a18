"""Maximum subarray sum (Kadane)."""

STATEMENT = """
Given a non-empty list of integers, return the largest sum of a non-empty contiguous
subarray. Write `def max_subarray(nums: list[int]) -> int`.
"""

FN_NAME = "max_subarray"

REFERENCE = """
def max_subarray(nums):
    best = current = nums[0]
    for x in nums[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best
"""


def cases(rng):
    fixed = [[[-2, 1, -3, 4, -1, 2, 1, -5, 4]], [[1]], [[-3, -1, -2]], [[5, 4, -1, 7, 8]]]
    return fixed + [[[rng.randint(-100, 100) for _ in range(rng.randint(1, 300))]] for _ in range(21)]
