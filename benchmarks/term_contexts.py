"""Benchmark: could a look-up by content find the next term of a tiny-profile expression?

    python benchmarks/term_contexts.py [--operators 3 5 7 11 15 19] [--problems 500]

`length_probe.py` and `copy_probe.py` show the tiny model finding the prompt's terms by their
distance, which fails past the training lengths. The alternative that does not depend on length
is an induction-style look-up: find where the terms just written occur in the prompt and copy
the one after them. With single-digit operands a term is one of 18 sign-and-digit pairs, so one
term of context is often ambiguous. On fresh expressions of the active arithmetic profile (their
own seed, no split read, no model), this prints per operator count the share of terms (after the
first) whose c preceding terms occur exactly once in the expression, for c = 1, 2, 3: the share
a content look-up with that much context could find without ambiguity.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from selfcest.data.arithmetic import config_from_mapping, generate_expression  # noqa: E402
from selfcest.teachers import parse_terms  # noqa: E402
from stages.common import load_params  # noqa: E402


def unique_context_share(terms_list: list[list[int]], context: int) -> float:
    """Share of terms k >= 1 whose `context` preceding terms (fewer at the start) occur once as a
    run followed by a term in their expression."""
    found = total = 0
    for terms in terms_list:
        for k in range(1, len(terms)):
            window = terms[max(0, k - context) : k]
            size = len(window)
            hits = sum(terms[j : j + size] == window for j in range(len(terms) - size))
            found += hits == 1
            total += 1
    return found / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--operators", type=int, nargs="+", default=[3, 5, 7, 11, 15, 19])
    parser.add_argument("--problems", type=int, default=500, help="per operator count")
    parser.add_argument("--seed", type=int, default=7000, help="draw of the expressions (plus the count)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args()
    arithmetic = load_params(args.params)["arithmetic"]
    # What `benchmarks.probes.active_generator` reads; that module loads torch and TRL on import
    # (~17 s measured), which this model-free count does not need.
    generator = config_from_mapping(arithmetic["profiles"][arithmetic["profile"]].get("generator") or {})
    for num_operators in args.operators:
        config = config_from_mapping({"num_operators": (num_operators, num_operators)}, generator)
        rng = random.Random(args.seed + num_operators)
        expressions = [parse_terms(generate_expression(config, rng)[0]) for _ in range(args.problems)]
        shares = {f"context_{c}": round(unique_context_share(expressions, c), 3) for c in (1, 2, 3)}
        print(json.dumps({"operators": num_operators, **shares}), flush=True)


if __name__ == "__main__":
    main()
