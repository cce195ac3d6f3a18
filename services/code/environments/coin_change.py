"""Coin change: fewest coins that make an amount."""

STATEMENT = """
Given a list of coin denominations and a target amount, return the minimum number of coins
needed to make that amount (each coin may be used any number of times), or -1 if it cannot
be made. Write `def coin_change(coins: list[int], amount: int) -> int`.
"""

FN_NAME = "coin_change"

REFERENCE = """
def coin_change(coins, amount):
    best = [0] + [amount + 1] * amount
    for value in range(1, amount + 1):
        for coin in coins:
            if coin <= value and best[value - coin] + 1 < best[value]:
                best[value] = best[value - coin] + 1
    return best[amount] if best[amount] <= amount else -1
"""


def cases(rng):
    fixed = [[[1, 5, 10, 25], 30], [[2], 3], [[1], 0], [[1, 2, 5], 11], [[186, 419, 83, 408], 6249], [[3, 7], 1]]
    randoms = [[sorted({rng.randint(1, 20) for _ in range(rng.randint(2, 5))}), rng.randint(0, 300)] for _ in range(19)]
    return fixed + randoms
