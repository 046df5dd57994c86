"""The project's tests, runnable with plain ``python3 test_stats.py`` (no pytest needed)."""

import sys

from stats import mean, spread

CHECKS = [
    ("mean of 2, 4, 6 is 4", lambda: mean([2, 4, 6]) == 4),
    ("mean of one value is that value", lambda: mean([5]) == 5),
    ("spread of 1, 9, 3 is 8", lambda: spread([1, 9, 3]) == 8),
]

failed = 0
for name, check in CHECKS:
    ok = check()
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
print(f"{len(CHECKS) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
