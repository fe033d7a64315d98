"""Benchmark: halves that start with a subtracted term, in the warm-up's teaching and in the sweep.

    python benchmarks/half_leads.py [--params params.yaml] [--episodes CELL_DIR/episodes.jsonl.gz ...]
        [--budget 256]

Every training problem starts with a positive term, so the warm-up teacher hands clones halves of
sums that start with one; only the second half of a sum can start with a subtracted term. In a longer
sum the halves of a second half are handed on too, and their `first half` starts with a subtracted
term about as often as any term is one. Prints one JSON line with the teacher's clone conversations
by (key, lead sign, number of terms), built as the warm-up builds them
(`benchmarks.probes.stage_warmup_conversations`) (no model runs), then, per `--episodes` file (a sweep cell's traces), one JSON line per
(split, method, budget, key, lead) with how many clones solved such a half alone and how many were
right (`selfcest.analysis.half_leaf_results`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch loads (selfcest.warmup imports it), as the stages do

from selfcest.analysis import half_leaf_results  # noqa: E402
from selfcest.halves import HALF_KEYS, parse_terms  # noqa: E402
from selfcest.reports import episode_records  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.probes import stage_warmup_conversations  # noqa: E402
from stages.common import load_params  # noqa: E402

# A clone handed one half: `[first half] 3-4+5\nsum` (`selfcest.prompts.clone_user_message`).
_HALF_PROMPT = re.compile(r"\[(?P<key>" + "|".join(HALF_KEYS) + r")\] (?P<expr>[0-9+\-]+)\nsum")


def teacher_halves(params: dict) -> Counter[tuple[str, str, int]]:
    """The warm-up's clone conversations holding one half, by (key, lead sign, number of terms)."""
    counts: Counter[tuple[str, str, int]] = Counter()
    for conversation in stage_warmup_conversations(params):
        user = next(m["content"] for m in conversation["messages"] if m["role"] == "user")
        match = _HALF_PROMPT.fullmatch(str(user))
        if match:
            terms = parse_terms(match["expr"])
            counts[(match["key"], "-" if terms[0] < 0 else "+", len(terms))] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--episodes", nargs="*", default=[], help="sweep cells' episodes.jsonl.gz")
    parser.add_argument("--budget", type=int, default=None, help="only this budget (default: all)")
    args = parser.parse_args()
    counts = teacher_halves(load_params(Path(args.params)))
    print(
        json.dumps(
            {
                "teacher": [
                    {"key": k, "lead": s, "terms": n, "conversations": c}
                    for (k, s, n), c in sorted(counts.items())
                ]
            }
        )
    )
    for path in args.episodes:
        for row in half_leaf_results(episode_records(Path(path), args.budget)):
            print(json.dumps({"episodes": path, **row}))


if __name__ == "__main__":
    main()
