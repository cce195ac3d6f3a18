"""Merge overlapping intervals."""

STATEMENT = """
Given a list of intervals [start, end] (start <= end), merge all overlapping or touching
intervals and return the result sorted by start. Write
`def merge_intervals(intervals: list[list[int]]) -> list[list[int]]`.
"""

FN_NAME = "merge_intervals"

REFERENCE = """
def merge_intervals(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
"""


def cases(rng):
    fixed = [[[[1, 3], [2, 6], [8, 10], [15, 18]]], [[[1, 4], [4, 5]]], [[]], [[[5, 5]]], [[[1, 10], [2, 3]]]]

    def interval():
        start = rng.randint(0, 100)
        return [start, start + rng.randint(0, 15)]

    return fixed + [[[interval() for _ in range(rng.randint(1, 30))]] for _ in range(20)]
