"""Benchmark: does a checkpoint find term k of the prompt? Teacher-forced, per term index.

    python benchmarks/copy_probe.py artifacts/warmup_model [--operators 5 7 8 10 12 14 18]

`length_probe.py` measures whole answers, which fail for any reason (a wrong sum, a lost term).
This one isolates the look-up that both the monolithic solver and a delegating root need before
any arithmetic: each step line `acc op term=new` of a monolithic solution names the prompt's next
term, and a root's first spawn copies every term into its clones' tasks. On fresh expressions
(the active arithmetic profile's generator in `--params`, `--problems` per operator count, their
own seed, no test split read), the warm-up's teacher conversations are scored teacher-forced:
given the teacher's prefix, is every token of term k (its sign and digits) the model's argmax?
One JSON line per operator count: `mono` and `root` map the term index k (0-based in the whole
expression; a monolithic solution starts from term 0, so its first looked-up term is 1) to the
share of terms copied exactly. Teacher forcing keeps the prefix right, so an error at term k is
the look-up's at k, not a slip carried from an earlier term; only the first assistant turn is
scored (the root's first spawn, the monolithic solution).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.model import load_model  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402
from selfcest.warmup import tokenize_conversations, warmup_settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.probes import active_generator, probe_conversations, probe_teacher  # noqa: E402
from stages.common import load_params  # noqa: E402

TERM = re.compile(r"[+-]?\d+")
CLONE_TASK = re.compile(r"value of ([0-9+\-]+)\.")
STEP_LINE = re.compile(r"(?m)^(-?\d+)([+-]\d+)=(-?\d+)$")


def term_spans(kind: str, turn: str) -> list[tuple[int, int, int]]:
    """(start, end, term index) of each looked-up term in the first assistant turn's text."""
    spans = []
    if kind == "arith_root_delegate":
        index = 0
        for task in CLONE_TASK.finditer(turn):
            for term in TERM.finditer(task.group(1)):
                start = task.start(1) + term.start()
                spans.append((start, start + len(term.group()), index))
                index += 1
    else:
        for step, line in enumerate(STEP_LINE.finditer(turn)):
            spans.append((line.start(2), line.end(2), step + 1))
    return spans


@torch.no_grad()
def copy_accuracy(
    model: Any, tokenizer: Any, conversations: list[dict[str, Any]]
) -> dict[str, dict[int, float]]:
    rows = tokenize_conversations(conversations, tokenizer, max_length=4096)
    exact: dict[str, dict[int, list[bool]]] = {"mono": {}, "root": {}}
    for ids, mask, kind in zip(rows["input_ids"], rows["assistant_masks"], rows["kind"], strict=True):
        predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        right = [True] + [predicted[t - 1] == ids[t] for t in range(1, len(ids))]
        pieces = [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
        if "".join(pieces) != tokenizer.decode(ids, skip_special_tokens=False):
            raise ValueError(
                "tokens do not decode one by one to the whole text; term spans would be misplaced"
            )
        starts = [0]
        for piece in pieces:
            starts.append(starts[-1] + len(piece))
        first = mask.index(1)
        end = first
        while end < len(mask) and mask[end]:
            end += 1
        turn = "".join(pieces[first:end])
        key = "root" if kind == "arith_root_delegate" else "mono"
        for start, stop, index in term_spans(kind, turn):
            lo, hi = starts[first] + start, starts[first] + stop
            tokens = [t for t in range(first, end) if starts[t] < hi and starts[t + 1] > lo]
            exact[key].setdefault(index, []).append(all(right[t] for t in tokens))
    return {
        key: {k: round(sum(v) / len(v), 3) for k, v in sorted(by_index.items())}
        for key, by_index in exact.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--operators", type=int, nargs="+", default=[5, 7, 8, 10, 12, 14, 18])
    parser.add_argument("--problems", type=int, default=48, help="per operator count")
    parser.add_argument(
        "--seed", type=int, default=1000, help="draw of the probe expressions (plus the count)"
    )
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args()
    params = load_params(args.params)
    settings = warmup_settings(dict(params["warmup"]), seed=params["seed"])
    generator, teacher = active_generator(params), probe_teacher(settings.teacher)
    tokenizer = load_tokenizer(args.checkpoint)
    model = load_model(args.checkpoint, dtype="float32").eval()
    for num_operators in args.operators:
        rng = random.Random(args.seed + num_operators)
        conversations = probe_conversations(generator, teacher, num_operators, args.problems, rng)
        print(
            json.dumps({"operators": num_operators, **copy_accuracy(model, tokenizer, conversations)}),
            flush=True,
        )


if __name__ == "__main__":
    main()
