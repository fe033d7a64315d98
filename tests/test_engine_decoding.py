"""benchmarks/engine_decoding.py: the engine and transformers' `generate` on the same micro-batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_decoding.py"


def test_the_benchmark_finds_the_same_rows_both_ways(tiny_checkpoint: Path, tmp_path: Path) -> None:
    sums = {"1+2": 3, "3+4-5+6": 8, "7": 7, "8-9+1+2+3-4+5": 6, "6+6": 12, "2-3+4": 3}
    split = tmp_path / "split.jsonl"
    split.write_text(
        "".join(
            json.dumps(
                {"id": f"a{i}", "expr": e, "answer": str(v), "num_operators": e.count("+") + e.count("-")}
            )
            + "\n"
            for i, (e, v) in enumerate(sums.items())
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--model",
            str(tiny_checkpoint),
            "--split",
            str(split),
            "--budget",
            "12",
            "--problems",
            "5",
            "--batch-size",
            "4",
            "--repeats",
            "1",
        ],
        cwd=SCRIPT.parents[1],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["problems"] == 5 and report["budget"] == 12
    assert report["rows_that_differ"] == 0
    assert 5 <= report["generated_tokens"] <= 5 * 12
    assert report["engine_seconds"] > 0 and report["generate_seconds"] > 0
