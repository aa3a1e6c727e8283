"""tests/lib/checks.py: the pass/fail counter of the Python tests, with no
dependency beyond Python itself (tests/lib/testlib.py re-exports it)."""


class Checks:
    """Counts checks; prints each failure; ends with 'N passed, N failed'."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL", what, flush=True)
        return ok

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
