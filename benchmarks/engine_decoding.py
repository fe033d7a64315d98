"""Benchmark: the engine's decoding loop against transformers' `generate`, on one split's prompts.

    python benchmarks/engine_decoding.py --model artifacts/warmup_model \
        --split data/arithmetic/ood.jsonl --budget 256 --problems 128

Both decode the same micro-batches greedily (the engine's: prompts sorted by length, at most
`--batch-size` rows, left-padded) from the monolithic prompt of each record. `generate` keeps an
ended row in its batch, padded, until the batch's last row ends; the engine drops ended rows
(`TransformersEngine._decode`). Prints each one's best wall time of `--repeats`, the tokens
generated, and the number of rows whose tokens differ (expected: none).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.engine import GenerationRequest, SamplingConfig, TransformersEngine, left_padded  # noqa: E402
from selfcest.model import load_model  # noqa: E402
from selfcest.prompts import root_messages  # noqa: E402
from selfcest.tasks import task_from_record  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402


def generate_rows(
    engine: TransformersEngine, prompts: list[list[int]], budget: int, batch_size: int
) -> list[list[int]]:
    """transformers' `generate` on the engine's micro-batches, each row cut after its first stop token."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    rows: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        input_ids, attention_mask = left_padded([prompts[i] for i in chunk], engine.pad_id)
        width = input_ids.shape[1]
        with torch.no_grad():
            output = engine.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=budget,
                do_sample=False,
                eos_token_id=engine.stop_ids,
                pad_token_id=engine.pad_id,
            )
        for row, index in enumerate(chunk):
            tokens = output[row, width:].tolist()
            end = next((p + 1 for p, t in enumerate(tokens) if t in engine.stop_ids), len(tokens))
            rows[index] = tokens[:end]
    return rows


def best_of(repeats: int, fn: Callable[[], list[list[int]]]) -> tuple[float, list[list[int]]]:
    best, rows = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - start)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="artifacts/warmup_model")
    parser.add_argument("--split", type=Path, default=Path("data/arithmetic/ood.jsonl"))
    parser.add_argument("--budget", type=int, default=256, help="max_new_tokens of every request")
    parser.add_argument("--problems", type=int, default=128, help="the split's first N records")
    parser.add_argument("--batch-size", type=int, default=64, help="as eval.sweep.batch_size")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as eval.sweep.threads")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, dtype="float32").eval()
    engine = TransformersEngine(model, tokenizer, max_batch_size=args.batch_size)
    with args.split.open() as lines:
        records = [json.loads(line) for line, _ in zip(lines, range(args.problems), strict=False)]
    prompts = []
    for record in records:
        messages = root_messages(task_from_record(record, "monolithic").question)
        prompts.append(
            tokenizer.encode(
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )
        )
    requests = [GenerationRequest(prompt, args.budget) for prompt in prompts]
    engine_seconds, engine_rows = best_of(
        args.repeats, lambda: [r.token_ids for r in engine.generate(requests, SamplingConfig())]
    )
    generate_seconds, generate_rows_ = best_of(
        args.repeats, lambda: generate_rows(engine, prompts, args.budget, args.batch_size)
    )
    print(
        json.dumps(
            {
                "split": str(args.split),
                "problems": len(prompts),
                "budget": args.budget,
                "engine_seconds": round(engine_seconds, 3),
                "generate_seconds": round(generate_seconds, 3),
                "generated_tokens": sum(len(r) for r in engine_rows),
                "rows_that_differ": sum(a != b for a, b in zip(engine_rows, generate_rows_, strict=True)),
            }
        )
    )


if __name__ == "__main__":
    main()
