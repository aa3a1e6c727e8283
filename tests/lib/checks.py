"""tests/lib/checks.py: the pass/fail counter of the Python tests, with no
dependency beyond Python itself (tests/lib/testlib.py re-exports it)."""


class Checks:
    """Counts checks; prints each failure; ends with 'N passed, N failed'."""

    def __init__(self, show_pass=False):
        self.passed = self.failed = 0
        self.show_pass = show_pass  # also print "PASS what" (the GPU runbook's scripts)

    def __call__(self, ok, what):
        ok = bool(ok)
        if ok:
            self.passed += 1
            if self.show_pass:
                print("PASS", what, flush=True)
        else:
            self.failed += 1
            print("FAIL", what, flush=True)
        return ok

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
