"""benchmarks/term_contexts.py: which terms a look-up by their preceding terms finds unambiguously."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "term_contexts.py"
spec = importlib.util.spec_from_file_location("term_contexts", SCRIPT)
term_contexts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(term_contexts)


def test_a_context_is_unique_when_it_occurs_once_before_a_term() -> None:
    # 1 2 1 3: one term of context finds only the 1 after 2 (the 1 before 2 and before 3 collide);
    # two terms find 1 -> 2 and 2 -> 1; the first term's context is the 1 alone, which repeats.
    assert term_contexts.unique_context_share([[1, 2, 1, 3]], 1) == pytest.approx(1 / 3)
    assert term_contexts.unique_context_share([[1, 2, 1, 3]], 2) == pytest.approx(2 / 3)
    # Signs count: -1 and 1 are different terms; shares pool the terms of all expressions.
    assert term_contexts.unique_context_share([[1, 2, -1, 3], [4, 4, 4]], 1) == pytest.approx(3 / 5)
    assert term_contexts.unique_context_share([], 2) == 0.0


def test_the_script_prints_one_line_per_operator_count() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--operators", "3", "11", "--problems", "40"],
        cwd=SCRIPT.parents[1],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["operators"] for line in lines] == [3, 11]
    for line in lines:
        assert 0 < line["context_1"] <= line["context_2"] <= 1
