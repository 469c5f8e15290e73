"""Answers that keep the math verifier busy, for the tests of its CPU budget (rewards/math.py)."""

# A sum of 60 fractions, under every text limit (answer_limits.py): sympy spends about 28 CPU seconds
# on it against the gold "6" (2-core dev machine, 2026-11-29), nine times the default 3 s budget, so a
# faster machine cannot finish it within the budget. (The product (x+0)...(x+99) used before took 3.2
# CPU seconds here: it sat on the default budget's edge and passed or failed by the machine's speed.)
SLOW_ANSWER = r"\boxed{" + "+".join(f"\\frac{{x}}{{x+{k}}}" for k in range(60)) + "}"
