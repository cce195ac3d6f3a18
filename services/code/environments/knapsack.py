"""0/1 knapsack, as a stdin/stdout program."""

STATEMENT = """
Read from standard input: a line "n W", then n lines "weight value". Each item can be taken
at most once. Print the largest total value of items whose total weight is at most W.
"""

FN_NAME = ""

REFERENCE = """
import sys


def main():
    data = sys.stdin.read().split()
    n, capacity = int(data[0]), int(data[1])
    best = [0] * (capacity + 1)
    for i in range(n):
        weight, value = int(data[2 + 2 * i]), int(data[3 + 2 * i])
        for room in range(capacity, weight - 1, -1):
            best[room] = max(best[room], best[room - weight] + value)
    print(best[capacity])


main()
"""


def cases(rng):
    def case(n, capacity):
        items = [f"{rng.randint(1, 30)} {rng.randint(0, 100)}" for _ in range(n)]
        return "\n".join([f"{n} {capacity}", *items]) + "\n"

    fixed = ["3 4\n1 15\n3 20\n4 30\n", "1 0\n1 5\n", "0 10\n"]
    return fixed + [case(rng.randint(1, 40), rng.randint(0, 200)) for _ in range(22)]
