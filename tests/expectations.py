"""Literal expectations shared by several tests, written from the issues rather than from the code,
so that a change to the library cannot quietly change what the tests demand."""

# Issue 5: the columns `reports/sweep.csv` must have at least (one row per sweep cell).
REQUIRED_SWEEP_COLUMNS = frozenset(
    {
        "dataset",
        "split",
        "method",
        "budget",
        "n",
        "accuracy",
        "ci_low",
        "ci_high",
        "gen_tokens",
        "total_tokens",
        "critical_tokens",
        "seconds",
        "clones",
    }
)
