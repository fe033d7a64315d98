"""Benchmark: does training on randomised position ids lengthen the tiny model's arithmetic?

    python benchmarks/position_ids.py --scheme gaps2 --out /tmp/pos/gaps2
    python benchmarks/length_probe.py /tmp/pos/gaps2/model      # greedy, contiguous positions

An arithmetic-only warm-up (the `arithmetic` teachers of `params.yaml`'s `warmup.teacher`, every
`data/arithmetic/train.jsonl` record, the warm-up's optimiser settings, `--steps` updates) from
`artifacts/init_model`, with the position ids of every training row set by `--scheme`:
- `contiguous`: 0, 1, 2, ... (what the pipeline does; the control);
- `randomN`: a sorted random subset of [0, N) (Ruoss et al. 2023, "Randomized positional
  encodings boost length generalization of transformers"), e.g. `random1024`;
- `gapsK`: a running sum of random gaps drawn from 1..K, e.g. `gaps2`;
- `strideK`: 0, K, 2K, ...
Then, per operator count, on fresh expressions (their own seed; no test split is read), the share
of monolithic and delegating-root teacher conversations whose every assistant token is the
model's argmax, under each position scheme of `--eval-schemes` (the same names). Teacher-forced
exactness needs no generation, so it shows at once which position scheme a checkpoint works
under; the engines, GRPO and `length_probe.py` all use contiguous positions. A delegating root's
teacher picks a chunk size and a budget at random, which a model cannot guess, so its exactness
is a lower bound.
Prints one JSON line per operator count. Run again with other `--eval-schemes` and the same
`--out`, it loads the finished model and only measures.
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

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

from selfcest.checkpoints import fingerprint  # noqa: E402
from selfcest.teachers import build_warmup_conversations  # noqa: E402
from selfcest.warmup import tokenize_conversations, warmup_settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.probes import active_generator, probe_conversations, probe_teacher, trained_warmup  # noqa: E402
from stages.common import load_params, read_jsonl  # noqa: E402


def position_ids(length: int, scheme: str, rng: random.Random) -> list[int]:
    """`contiguous`; `strideK`: 0, K, 2K, ...; `randomN`: a sorted random subset of [0, N) (of
    [0, length) when longer); `gapsK`: a running sum of random gaps drawn from 1..K."""
    if scheme == "contiguous":
        return list(range(length))
    name = scheme.rstrip("0123456789")
    number = int(scheme[len(name) :] or 0)
    if name == "stride" and number > 0:
        return [i * number for i in range(length)]
    if name == "random" and number > 0:
        return sorted(rng.sample(range(max(number, length)), length))
    if name == "gaps" and number > 0:
        ids, position = [], 0
        for _ in range(length):
            ids.append(position)
            position += rng.randint(1, number)
        return ids
    raise ValueError(f"unknown position scheme {scheme!r} (contiguous, strideK, randomN or gapsK)")


class PositionIdsCollator(DataCollatorForLanguageModeling):
    """TRL's padding collator (labels, attention mask) with each row's position ids replaced."""

    def __init__(self, pad_token_id: int, *, scheme: str, seed: int) -> None:
        super().__init__(pad_token_id=pad_token_id, return_position_ids=True)
        self.scheme = scheme
        self.rng = random.Random(seed)

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        for row, mask in enumerate(batch["attention_mask"]):
            length = int(mask.sum())  # right padding: the row's tokens come first
            batch["position_ids"][row, :length] = torch.tensor(position_ids(length, self.scheme, self.rng))
        return batch


@torch.no_grad()
def teacher_forced_exactness(model: Any, dataset: Dataset, scheme: str) -> dict[str, float]:
    """`dataset`: `selfcest.warmup.tokenize_conversations` rows (ids, assistant mask, kind)."""
    rng = random.Random(0)
    exact: dict[str, list[bool]] = {}
    for ids, mask, kind in zip(
        dataset["input_ids"], dataset["assistant_masks"], dataset["kind"], strict=True
    ):
        tokens = torch.tensor([ids])
        positions = torch.tensor([position_ids(len(ids), scheme, rng)])
        # The attention mask matters: without one, transformers reads non-consecutive position ids
        # as packed sequences and lets every token attend to itself only.
        logits = model(
            input_ids=tokens, attention_mask=torch.ones_like(tokens), position_ids=positions
        ).logits[0]
        scored = torch.tensor(mask[1:], dtype=torch.bool)
        exact.setdefault(kind, []).append(
            bool((logits[:-1].argmax(-1)[scored] == tokens[0, 1:][scored]).all())
        )
    return {kind.removeprefix("arith_"): round(sum(v) / len(v), 3) for kind, v in sorted(exact.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scheme", required=True, help="training position ids: contiguous, strideK, randomN or gapsK"
    )
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", type=Path, required=True, help="the run's checkpoints and its final model")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--init", default="artifacts/init_model")
    parser.add_argument("--arithmetic", default="data/arithmetic/train.jsonl")
    parser.add_argument("--operators", type=int, nargs="+", default=[5, 7, 8, 10, 12, 14])
    parser.add_argument("--conversations", type=int, default=80, help="per operator count and kind pair")
    parser.add_argument("--eval-schemes", nargs="+", default=["contiguous", "stride2", "gaps2", "random1024"])
    args = parser.parse_args()
    params = load_params(args.params)
    warmup = dict(params["warmup"])
    settings = warmup_settings(warmup, seed=params["seed"])
    teacher, config = settings.teacher, dataclasses.replace(settings.training, max_steps=args.steps)
    position_ids(1, args.scheme, random.Random(0))  # an unknown scheme fails before training
    run_fingerprint = fingerprint(
        {"scheme": args.scheme, "steps": args.steps, "init": args.init, "data": args.arithmetic}
        | {"warmup": warmup, "seed": params["seed"]}
    )
    tokenizer, model = trained_warmup(
        args.out,
        init=args.init,
        run_fingerprint=run_fingerprint,
        config=config,
        conversations=lambda: build_warmup_conversations(
            read_jsonl(args.arithmetic), [], seed=params["seed"], config=teacher
        ),
        data_collator=lambda tokenizer: PositionIdsCollator(
            tokenizer.pad_token_id, scheme=args.scheme, seed=params["seed"]
        ),
        label={"scheme": args.scheme},
    )
    model.eval()
    generator, teacher = active_generator(params), probe_teacher(teacher)
    for num_operators in args.operators:
        rng = random.Random(num_operators)
        probe = probe_conversations(generator, teacher, num_operators, args.conversations, rng)
        tokenized = tokenize_conversations(probe, tokenizer, max_length=4096)  # once for every scheme
        result = {scheme: teacher_forced_exactness(model, tokenized, scheme) for scheme in args.eval_schemes}
        print(json.dumps({"operators": num_operators, **result}), flush=True)


if __name__ == "__main__":
    main()
