"""A `GenerationEngine` whose policy is a Python function: for tests of the runtime's limits.

The function sees each request's decoded prompt and returns the text to "generate"; the engine
tokenizes it, cuts it to the request's `max_new_tokens` and appends the end-of-turn token when the
text fits, exactly as a model that stopped on its own would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from selfcest.engine import EngineStats, GenerationRequest, GenerationResult, SamplingConfig
from selfcest.tokenizer import stop_token_ids

Policy = Callable[[str], str]


class ScriptedEngine:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, policy: Policy) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.end_id = stop_token_ids(tokenizer)[0]
        self.stats = EngineStats()
        self.batches: list[list[str]] = []
        """Decoded prompts of every call, to check what was batched together."""

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationResult]:
        self.stats.calls += 1
        self.stats.batch_sizes.append(len(requests))
        prompts = [self.tokenizer.decode(r.prompt_ids, skip_special_tokens=False) for r in requests]
        self.batches.append(prompts)
        results = []
        for request, prompt in zip(requests, prompts, strict=True):
            ids = self.tokenizer.encode(self.policy(prompt), add_special_tokens=False) + [self.end_id]
            reason = "stop" if len(ids) <= request.max_new_tokens else "length"
            ids = ids[: request.max_new_tokens]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            logprobs = [0.0] * len(ids) if sampling.return_logprobs else None
            results.append(GenerationResult(ids, text, reason, logprobs))
        self.stats.generated_tokens += sum(len(r.token_ids) for r in results)
        return results
