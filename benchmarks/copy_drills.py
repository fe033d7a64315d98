"""Benchmark: do copying drills on long expressions move the tiny model's length cliff?

    python benchmarks/copy_drills.py --out /tmp/drills/on
    python benchmarks/copy_drills.py --drills 0 --out /tmp/drills/off     # the control

`copy_probe.py` shows the cliff is the look-up of the prompt's terms, which breaks one operator
past the longest training expression in both modes. Here the arithmetic-only warm-up of
`position_ids.py` (the warm-up's arithmetic teachers, every `data/arithmetic/train.jsonl` record,
the warm-up's optimiser settings, `--steps` updates from `artifacts/init_model`) also reads
`--drills` copying conversations on fresh expressions of `--drill-operators` operators: half ask
to repeat the expression, half to list its terms one per line. They teach the look-up over longer
inputs with no arithmetic in them: no sum of a long expression is ever taught, so the arithmetic
itself stays at the training lengths, while copying is what a pretrained model brings to the
paper's long problems. No drill expression is a test or ood expression. `--drills-only` leaves
the arithmetic out, to see whether this model learns the copying at all.
Then, per operator count, on fresh expressions, one JSON line: `drills`, the share of fresh drills
of each kind whose every answer token is the model's argmax (teacher-forced), and `mono` / `root`,
`copy_probe.py`'s per-term-index copy accuracy of the monolithic step lines and the root's first
spawn. A finished run's `--out` is measured again without training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)


from selfcest.checkpoints import fingerprint  # noqa: E402
from selfcest.data.arithmetic import config_from_mapping, generate_expression  # noqa: E402

# `_solo`: the teachers' one-turn conversation (system prompt, question, answer), as the warm-up builds them.
from selfcest.teachers import _solo, build_warmup_conversations, parse_terms  # noqa: E402
from selfcest.warmup import tokenize_conversations, warmup_settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.copy_probe import copy_accuracy  # noqa: E402
from benchmarks.position_ids import teacher_forced_exactness  # noqa: E402
from benchmarks.probes import active_generator, probe_conversations, probe_teacher, trained_warmup  # noqa: E402
from stages.common import load_params, read_jsonl  # noqa: E402

DRILL_SYSTEM_PROMPT = "You copy the text you are given exactly."


def drill_conversations(
    params: dict[str, Any], count: int, operators: tuple[int, int], held_out: set[str], seed: int
) -> list[dict[str, Any]]:
    """`count` copying conversations on fresh expressions, none of them in `held_out`."""
    rng = random.Random(seed)
    config = config_from_mapping({"num_operators": operators}, active_generator(params))
    drills: list[dict[str, Any]] = []
    for _ in range(100 * count):  # bounded: short drills can run out of expressions outside held_out
        if len(drills) == count:
            break
        expr, _ = generate_expression(config, rng)
        if expr in held_out:
            continue
        if len(drills) % 2 == 0:
            drills.append(_solo(DRILL_SYSTEM_PROMPT, f"Repeat {expr}.", expr, "copy_repeat"))
        else:
            terms = "\n".join(f"{t:+d}" if i else str(t) for i, t in enumerate(parse_terms(expr)))
            drills.append(_solo(DRILL_SYSTEM_PROMPT, f"List the terms of {expr}.", terms, "copy_terms"))
    if len(drills) < count:
        raise ValueError(f"only {len(drills)} of {count} drills found outside the held-out expressions")
    return drills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drills", type=int, default=6000, help="copying conversations (0: the control)")
    parser.add_argument("--drill-operators", type=int, nargs=2, default=[1, 23])
    parser.add_argument(
        "--drills-only",
        action="store_true",
        help="no arithmetic conversations: can copying be learnt at all?",
    )
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", type=Path, required=True, help="the run's checkpoints and its final model")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--init", default="artifacts/init_model")
    parser.add_argument("--data", type=Path, default=Path("data/arithmetic"))
    parser.add_argument("--operators", type=int, nargs="+", default=[5, 7, 8, 10, 12, 14, 18])
    parser.add_argument("--problems", type=int, default=48, help="per operator count")
    args = parser.parse_args()
    params = load_params(args.params)
    warmup = dict(params["warmup"])
    settings = warmup_settings(warmup, seed=params["seed"])
    config = dataclasses.replace(settings.training, max_steps=args.steps)
    run_fingerprint = fingerprint(
        {"drills": args.drills, "drill_operators": args.drill_operators, "steps": args.steps}
        | {"drills_only": args.drills_only}
        | {"init": args.init, "warmup": warmup, "seed": params["seed"]}
    )

    def conversations() -> list[dict[str, Any]]:
        held_out = {r["expr"] for split in ("test", "ood") for r in read_jsonl(args.data / f"{split}.jsonl")}
        arithmetic = build_warmup_conversations(
            [] if args.drills_only else read_jsonl(args.data / "train.jsonl"),
            [],
            seed=params["seed"],
            config=settings.teacher,
            held_out_expressions=held_out,
        )
        drills = drill_conversations(
            params, args.drills, tuple(args.drill_operators), held_out, seed=params["seed"] + 1
        )
        every = arithmetic + drills
        random.Random(params["seed"]).shuffle(every)
        return every

    tokenizer, model = trained_warmup(
        args.out,
        init=args.init,
        run_fingerprint=run_fingerprint,
        config=config,
        conversations=conversations,
        label={"drills": args.drills},
    )
    model.eval()
    generator, teacher = active_generator(params), probe_teacher(settings.teacher)
    for num_operators in args.operators:
        rng = random.Random(1000 + num_operators)  # copy_probe.py's default draw
        conversations = probe_conversations(generator, teacher, num_operators, args.problems, rng)
        drills = drill_conversations(
            params, args.problems, (num_operators, num_operators), set(), seed=2000 + num_operators
        )
        # Every answer token the model's argmax, per drill kind: was the copying itself learnt here?
        exact = teacher_forced_exactness(
            model, tokenize_conversations(drills, tokenizer, max_length=4096), "contiguous"
        )
        result = copy_accuracy(model, tokenizer, conversations)
        print(json.dumps({"operators": num_operators, "drills": exact, **result}), flush=True)


if __name__ == "__main__":
    main()
