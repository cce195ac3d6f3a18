"""A guess-the-number interactive problem written for the tests and the bench: its testlib
interactor, a label, and binary searches in C++, Python and Java with holes to fill."""

from __future__ import annotations

# Guess the number in [1, 10^9]: the input holds it, the answer the most queries allowed.
# "? x" answers "<" (the number is less), ">" or "="; "! x" ends the game.
GUESS = r"""
#include "testlib.h"
#include <iostream>
int main(int argc, char* argv[]) {
    registerInteraction(argc, argv);
    long long secret = inf.readLong();
    int limit = ans.readInt();
    for (int queries = 0;; ++queries) {
        std::string op = ouf.readToken();
        if (op != "?" && op != "!") quitf(_pe, "expected ? or !, got %s", op.c_str());
        long long x = ouf.readLong(1LL, 1000000000LL, "x");
        if (op == "!") {
            if (x == secret) quitf(_ok, "guessed in %d queries", queries);
            quitf(_wa, "guessed %lld, the number was %lld", x, secret);
        }
        if (queries == limit) quitf(_wa, "more than %d queries", limit);
        std::cout << (secret < x ? "<" : secret > x ? ">" : "=") << std::endl;
    }
}
"""
SECRETS = (734182956, 1, 1000000000)
LABEL = {"interactor": GUESS, "tests": [{"input": f"{n}\n", "answer": "30\n"} for n in SECRETS]}

# The searches' holes: ``OFFSET`` (added to the final guess), ``FLUSH`` (whether it flushes the
# final guess), ``CRASH`` (a statement after each answer).

CPP_SEARCH = r"""
#include <cstdio>
int main() {
    long long lo = 1, hi = 1000000000;
    while (lo < hi) {
        long long m = (lo + hi) / 2;
        printf("? %lld\n", m); fflush(stdout);
        char r[4];
        if (scanf("%3s", r) != 1) return 0;
        if (r[0] == '=') { lo = hi = m; break; }
        if (r[0] == '<') hi = m - 1; else lo = m + 1;
    }
    printf("! %lld\n", lo + OFFSET); fflush(stdout);
}
"""
PY_SEARCH = """
lo, hi = 1, 10**9
while lo < hi:
    m = (lo + hi) // 2
    print("?", m, flush=True)
    r = input().strip()
    if r == "=":
        lo = hi = m
        break
    if r == "<":
        hi = m - 1
    else:
        lo = m + 1
print("!", lo, flush=FLUSH)
"""
JAVA_SEARCH = """
import java.io.*;
public class Main {
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        long lo = 1, hi = 1000000000;
        while (lo < hi) {
            long m = (lo + hi) / 2;
            System.out.println("? " + m); System.out.flush();
            String r = in.readLine().trim();
            if (r.equals("=")) { lo = hi = m; break; }
            if (r.equals("<")) hi = m - 1; else lo = m + 1;
            CRASH
        }
        System.out.println("! " + lo); System.out.flush();
    }
}
"""
