"""Balanced brackets, as a stdin/stdout program."""

STATEMENT = """
Read from standard input: a line with t, then t lines each holding a string of the brackets
()[]{}. For each string print YES if its brackets are balanced and properly nested, else NO.
"""

FN_NAME = ""

REFERENCE = """
def balanced(text):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif not stack or stack.pop() != pairs[ch]:
            return False
    return not stack


t = int(input())
for _ in range(t):
    print("YES" if balanced(input().strip()) else "NO")
"""


def cases(rng):
    def text():
        if rng.random() < 0.5:  # build a balanced one
            out = ""
            for _ in range(rng.randint(0, 10)):
                left, right = rng.choice(["()", "[]", "{}"])
                out = rng.choice([left + out + right, out + left + right])
            return out
        return "".join(rng.choice("()[]{}") for _ in range(rng.randint(1, 20)))

    def case():
        n = rng.randint(1, 20)
        return "".join([f"{n}\n", *(text() + "\n" for _ in range(n))])

    return ["3\n()\n([)]\n{[]}\n"] + [case() for _ in range(24)]
