"""Benchmark: the addition lines the warm-up teacher writes, by who writes them and how wide.

    python benchmarks/teacher_lines.py [--params params.yaml]

Builds the warm-up's conversations as `stages/warmup.py` builds them
(`benchmarks.probes.stage_warmup_conversations`: same records, seed, teacher settings and held-out
expressions) and counts their `a+b=c` lines: those of agents solving a sum alone, and those of
combining turns (an assistant turn right after a tool message: an agent adding its clones'
answers), with how many of the latter add two numbers of two or more digits
(`selfcest.analysis.WIDE_OPERAND`) and the largest operand's tens. Set beside
`reports/arithmetic_failures.csv`: how much practice the warm-up gives the additions that the
sweep's trees get wrong. No model runs; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch loads (selfcest.warmup imports it), as the stages do

from selfcest.analysis import WIDE_OPERAND, step_lines  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.probes import stage_warmup_conversations  # noqa: E402
from stages.common import load_params  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    params = load_params(Path(args.params))
    conversations = stage_warmup_conversations(params)
    alone, combining, wide = 0, 0, 0
    largest_tens: Counter[int] = Counter()
    for conversation in conversations:
        messages = conversation["messages"]
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            after_tool = index > 0 and messages[index - 1]["role"] == "tool"
            for a, b, _ in step_lines(str(message["content"])):
                if not after_tool:
                    alone += 1
                    continue
                combining += 1
                wide += abs(a) >= WIDE_OPERAND and abs(b) >= WIDE_OPERAND
                largest_tens[max(abs(a), abs(b)) // 10] += 1
    print(
        json.dumps(
            {
                "conversations": len(conversations),
                "alone_lines": alone,
                "combining_lines": combining,
                "wide_combining_lines": wide,
                "combining_lines_by_largest_operand_tens": dict(sorted(largest_tens.items())),
            }
        )
    )


if __name__ == "__main__":
    main()
