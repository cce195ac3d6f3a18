"""Count islands in a grid."""

STATEMENT = """
Given a grid as a list of equal-length strings of '1' (land) and '0' (water), return the
number of islands (groups of land cells joined horizontally or vertically). Write
`def num_islands(grid: list[str]) -> int`.
"""

FN_NAME = "num_islands"

REFERENCE = """
def num_islands(grid):
    seen = set()
    count = 0
    for r, row in enumerate(grid):
        for c, cell in enumerate(row):
            if cell != "1" or (r, c) in seen:
                continue
            count += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < len(grid) and 0 <= nx < len(row) and grid[ny][nx] == "1" and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
    return count
"""


def cases(rng):
    fixed = [[["11000", "11000", "00100", "00011"]], [["0"]], [["1"]], [[]]]

    def grid():
        rows, cols = rng.randint(1, 15), rng.randint(1, 15)
        land = rng.choice(["0001", "01", "011"])
        return ["".join(rng.choice(land) for _ in range(cols)) for _ in range(rows)]

    return fixed + [[grid()] for _ in range(21)]
