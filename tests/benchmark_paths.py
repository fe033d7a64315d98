"""Where the tests find the shared benchmark samples (real 2Wiki, MuSiQue, MATH-Hard and AIME records).

`../shared/data/benchmarks` beside the checkout is where `params.yaml`'s QA sources point; a checkout
that lives elsewhere falls back to the workplace's fixed `/work/shared`. With neither, collection stops
with the paths it tried: the tests that read real records must not turn into skips unnoticed."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = (REPO_ROOT.parent / "shared" / "data" / "benchmarks", Path("/work/shared/data/benchmarks"))


def _find_benchmarks() -> Path:
    for candidate in CANDIDATES:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in CANDIDATES)
    raise FileNotFoundError(f"the shared benchmark samples are in none of: {tried}")


BENCHMARKS = _find_benchmarks()
