"""Benchmark: generated tokens per second for a batch of clone requests vs the same one at a time.

    python benchmarks/clone_batching.py --model artifacts/init_model --clones 16 --max-new-tokens 48

Uses forced lengths (no early stop) so that both ways generate exactly the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import time

from selfcest.determinism import pin_cpu_kernels

pin_cpu_kernels()  # before torch is imported: the pipeline's CPU kernels (selfcest/determinism.py)

import torch  # noqa: E402

from selfcest.engine import GenerationRequest, SamplingConfig, TransformersEngine  # noqa: E402
from selfcest.model import load_model  # noqa: E402
from selfcest.prompts import CLONE_SYSTEM_PROMPT, arithmetic_question  # noqa: E402
from selfcest.tokenizer import load_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="artifacts/init_model")
    parser.add_argument("--clones", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    # An untrained model may stop early: no stop token, so both ways generate the same count (transformers warns).
    engine = TransformersEngine(model, tokenizer, max_batch_size=args.clones)
    engine.stop_ids = [-1]
    requests = []
    for i in range(args.clones):
        messages = [
            {"role": "system", "content": CLONE_SYSTEM_PROMPT},
            {"role": "user", "content": arithmetic_question(f"{10 + i}+{20 + 3 * i}-{i}")},
        ]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        requests.append(
            GenerationRequest(tokenizer.encode(prompt, add_special_tokens=False), args.max_new_tokens)
        )
    sampling = SamplingConfig()
    engine.generate(requests[:2], sampling)  # warm-up

    def timed(fn) -> tuple[float, int]:
        best = float("inf")
        tokens = 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            tokens = fn()
            best = min(best, time.perf_counter() - start)
        return best, tokens

    batched_s, batched_tokens = timed(
        lambda: sum(len(r.token_ids) for r in engine.generate(requests, sampling))
    )
    serial_s, serial_tokens = timed(
        lambda: sum(len(engine.generate([r], sampling)[0].token_ids) for r in requests)
    )
    result = {
        "clones": args.clones,
        "max_new_tokens": args.max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "batched_tokens": batched_tokens,
        "serial_tokens": serial_tokens,
        "batched_tokens_per_second": round(batched_tokens / batched_s, 1),
        "serial_tokens_per_second": round(serial_tokens / serial_s, 1),
        "speedup": round((batched_tokens / batched_s) / (serial_tokens / serial_s), 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
