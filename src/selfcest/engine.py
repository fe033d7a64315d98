"""Generation engines: one interface, a transformers implementation for CPU and a vLLM one for GPUs.

The runtime only speaks `GenerationEngine`: a batch of token-id prompts in, one continuation per
request out, each request with its own `max_new_tokens` and stop strings. Requests in one call are
generated together (that is what makes clones cheap), in micro-batches bounded by `max_batch_size`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from selfcest.tokenizer import stop_token_ids

FinishReason = Literal["stop", "length"]


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    """Hard cap on generated tokens for this request alone (>= 1)."""
    stop_strings: tuple[str, ...] = ()
    """Generation ends once the decoded continuation contains one of these (kept in the output)."""
    seed: int | None = None
    """This request's own sampling seed (`keyed_seed`): its draws then depend on it alone, not on the
    other requests of the call or the micro-batch size. None: the call's seed (`SamplingConfig.seed`)."""


@dataclass
class GenerationResult:
    token_ids: list[int]
    """Generated tokens, including the stop token when one ended the turn."""
    text: str
    """Decoded `token_ids` without special tokens, the text a parser reads."""
    finish_reason: FinishReason
    """`stop`: an end-of-turn token or stop string; `length`: `max_new_tokens` ran out."""
    logprobs: list[float] | None = None
    """Log-probability of each generated token under the sampling distribution (logits / temperature)."""


@dataclass
class SamplingConfig:
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    seed: int = 0
    """Seeds sampling; the same batch with the same seed gives the same tokens. A request with its own
    `seed` (the runtime gives every request one, `keyed_seed` of this seed and the request's key)
    draws from that alone; otherwise each micro-batch of one call draws from its own stream derived
    from this seed (`micro_batch_seed`)."""
    return_logprobs: bool = False


class GenerationEngine(Protocol):
    tokenizer: PreTrainedTokenizerBase

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationResult]:
        """Generate one continuation per request, in the order given."""
        ...


@dataclass
class EngineStats:
    """What an engine did, for tests and benchmarks (e.g. that clones of all roots shared a batch)."""

    calls: int = 0
    """`generate` calls."""
    batch_sizes: list[int] = field(default_factory=list)
    """Requests per forward batch, in order: one entry per micro-batch the engine ran."""
    generated_tokens: int = 0

    def since(self, earlier: EngineStats) -> EngineStats:
        """What was done after `earlier`, a copy of these stats taken before (`EngineStats.copy`)."""
        return EngineStats(
            self.calls - earlier.calls,
            self.batch_sizes[len(earlier.batch_sizes) :],
            self.generated_tokens - earlier.generated_tokens,
        )

    def copy(self) -> EngineStats:
        return EngineStats(self.calls, list(self.batch_sizes), self.generated_tokens)

    def add(self, other: EngineStats) -> None:
        """Count `other`'s work here too (a forked worker's, which its parent's stats never saw)."""
        self.calls += other.calls
        self.batch_sizes.extend(other.batch_sizes)
        self.generated_tokens += other.generated_tokens


# transformers' global generation defaults, set explicitly on every call: `generate` fills each unset
# field from the checkpoint's generation config, whose repetition_penalty, no_repeat_ngram_size or
# min_new_tokens would otherwise apply silently and make this engine disagree with vLLM and with the
# GRPO loss's log-probabilities. Length fields are left out: each call sets max/min_new_tokens.
_GENERATION_DEFAULTS = {
    key: value
    for key, value in GenerationConfig()._get_default_generation_params().items()
    if key not in ("max_length", "min_length")
}


def resolve_device(name: str) -> str:
    """A torch device string for `name`: `auto` is CUDA where torch sees a GPU, else the CPU; any
    other name is returned as given. The one reading of `auto` for the evaluation cells
    (`eval.sweep.device`) and `selfcest solve --device`."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def accelerator_name(device: str) -> str | None:
    """The GPU behind a torch `device` string ("cuda", "cuda:1"), as the driver names it; None on the
    CPU or where torch sees no such GPU. An evaluation cell records it beside the CPU
    (`selfcest.determinism.machine_description`), since its wall times are that card's."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    try:
        return str(torch.cuda.get_device_name(torch.device(device)))
    except (RuntimeError, AssertionError, ValueError):  # an index past the visible GPUs
        return None


def keyed_seed(seed: int, *key: int | str) -> int:
    """A 63-bit seed from `seed` and a key (the runtime's: task id, sample, copy, agent, turn), so that
    a request draws the same numbers whatever else shares its call. Strings enter by their sha256."""
    words = [seed] + [
        int.from_bytes(hashlib.sha256(part.encode()).digest()[:8], "big") if isinstance(part, str) else part
        for part in key
    ]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)


def request_seeds(seed: int, count: int) -> list[int]:
    """Per-request seeds of one vLLM call seeded with `seed` (vLLM seeds each request on its own).

    Why not `seed + i`: the runtime seeds round r's call with `seed + 1000 r`, so with more than 1,000
    requests in a round (the paper profile: 48 roots x 30 clones) request 1000 + j of round r drew
    the same numbers as request j of round r + 1. Mixing the pair (`micro_batch_seed`) does not collide."""
    return [micro_batch_seed(seed, i) for i in range(count)]


def micro_batch_seed(seed: int, micro_batch: int) -> int:
    """The seed of micro-batch `micro_batch` of a call seeded with `seed`.

    Why not `seed` for every micro-batch: row r of each would then draw the same random numbers, so
    samples of different problems at the same row were correlated (and identical prompts in two
    micro-batches gave identical samples). `SeedSequence` mixes the pair, so consecutive call seeds
    do not reuse each other's streams either."""
    if micro_batch == 0:
        return seed  # the first (often only) micro-batch keeps the call's own seed
    return keyed_seed(seed, micro_batch)


class _PerRowMaxNewTokens(StoppingCriteria):
    """Stops each row at its own budget: `generate` only takes one `max_new_tokens` for the batch."""

    def __init__(self, prompt_length: int, max_new_tokens: torch.Tensor) -> None:
        self.prompt_length = prompt_length
        self.max_new_tokens = max_new_tokens

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
    ) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        return (generated >= self.max_new_tokens).to(input_ids.device)  # type: ignore[return-value]


class _StopStringsInContinuation(StoppingCriteria):
    """Stops a row once its generated tokens, decoded, contain one of `stop_strings`.

    Why not `generate`'s own `stop_strings`: it matches the end of the whole sequence, prompt
    included, so a stop string that began in the prompt and ended in the first generated token
    stopped the row, and `_finished_length`, which reads the continuation only (the documented
    meaning), then saw no stop: the row came back as `length`, padded up to the longest row with the
    pad tokens counted as generated. Decoding every row at every step costs time, so only requests
    that ask for stop strings pay it."""

    def __init__(
        self, prompt_length: int, tokenizer: PreTrainedTokenizerBase, stop_strings: Sequence[str]
    ) -> None:
        self.prompt_length = prompt_length
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
    ) -> torch.BoolTensor:
        rows = input_ids[:, self.prompt_length :].tolist()
        done = [
            any(stop in self.tokenizer.decode(row, skip_special_tokens=False) for stop in self.stop_strings)
            for row in rows
        ]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class TransformersEngine:
    """Batched, KV-cached, left-padded generation with `PreTrainedModel.generate` (CPU or GPU).

    Per-request budgets and stop strings are handled with per-row stopping criteria, which
    `generate` supports natively (finished rows are padded while the others continue).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 64,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        # End-of-turn tokens: the chat format's, plus every end-of-sequence id the checkpoint's
        # generation config lists (Qwen3 lists two), which vLLM honours too.
        configured = getattr(model.generation_config, "eos_token_id", None)
        configured = [configured] if isinstance(configured, int) else list(configured or [])
        self.stop_ids = sorted(set(stop_token_ids(tokenizer)) | {int(i) for i in configured})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.stats = EngineStats()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationResult]:
        if not requests:
            return []
        self.stats.calls += 1
        # Sort by prompt length so that micro-batches waste little padding; keep the caller's order.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        results: list[GenerationResult | None] = [None] * len(requests)
        groups: dict[tuple[str, ...], list[int]] = {}
        for index in order:
            groups.setdefault(tuple(requests[index].stop_strings), []).append(index)
        micro_batch = 0
        for stop_strings, indices in groups.items():
            for start in range(0, len(indices), self.max_batch_size):
                chunk = indices[start : start + self.max_batch_size]
                self.stats.batch_sizes.append(len(chunk))
                seed = micro_batch_seed(sampling.seed, micro_batch)
                micro_batch += 1
                outputs = self._generate_batch([requests[i] for i in chunk], stop_strings, sampling, seed)
                for index, output in zip(chunk, outputs, strict=True):
                    results[index] = output
        finished = [r for r in results if r is not None]
        assert len(finished) == len(requests)
        self.stats.generated_tokens += sum(len(r.token_ids) for r in finished)
        return finished

    @torch.no_grad()
    def _generate_batch(
        self,
        requests: list[GenerationRequest],
        stop_strings: tuple[str, ...],
        sampling: SamplingConfig,
        seed: int,
    ) -> list[GenerationResult]:
        for request in requests:
            if request.max_new_tokens < 1:
                raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
            if not request.prompt_ids:
                raise ValueError("empty prompt")
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            input_ids[row, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            attention_mask[row, width - len(request.prompt_ids) :] = 1
        budgets = torch.tensor([r.max_new_tokens for r in requests], dtype=torch.long)
        criteria = StoppingCriteriaList([_PerRowMaxNewTokens(width, budgets.to(self.device))])
        if stop_strings:
            criteria.append(_StopStringsInContinuation(width, self.tokenizer, stop_strings))
        do_sample = sampling.temperature > 0
        # Requests with their own seeds sample row by row (`_PerRowSampling`), and `generate` then
        # decodes greedily over the one token each row drew.
        per_row = do_sample and all(r.seed is not None for r in requests)
        processors = LogitsProcessorList()
        if per_row:
            processors.append(
                _PerRowSampling([r.seed for r in requests], sampling.temperature, sampling.top_p, self.device)
            )
        generate_samples = do_sample and not per_row  # `generate`'s own sampling, one global generator
        config = GenerationConfig(**_GENERATION_DEFAULTS)  # then only what `SamplingConfig` says
        config.update(
            max_new_tokens=int(budgets.max()),
            min_new_tokens=0,
            do_sample=generate_samples,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=sampling.return_logprobs,
        )
        if generate_samples:
            config.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        # `generate` also fills the fields that `config` leaves None (min_p, suppress_tokens,
        # forced_eos_token_id, ...) from the model's own generation config, which `_GENERATION_DEFAULTS`
        # cannot set back: a bare one stands in for it during the call, so that a checkpoint's
        # generation_config.json changes nothing here (its end ids come in through `stop_ids`).
        own_config = self.model.generation_config
        self.model.generation_config = GenerationConfig(eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
        try:
            with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
                torch.manual_seed(seed)
                output = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention_mask.to(self.device),
                    generation_config=config,
                    stopping_criteria=criteria,
                    logits_processor=processors,
                )
        finally:
            self.model.generation_config = own_config
        generated = output.sequences[:, width:].cpu()
        logprobs = None
        if sampling.return_logprobs:
            temperature = sampling.temperature if do_sample else 1.0
            step_logits = torch.stack(output.logits, dim=1).float().cpu() / temperature
            logprobs = torch.log_softmax(step_logits, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
        results = []
        for row, request in enumerate(requests):
            tokens = generated[row].tolist()
            length, reason = self._finished_length(tokens, request.max_new_tokens, stop_strings)
            tokens = tokens[:length]
            results.append(
                GenerationResult(
                    token_ids=tokens,
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    finish_reason=reason,
                    logprobs=logprobs[row, :length].tolist() if logprobs is not None else None,
                )
            )
        return results

    def _finished_length(
        self, tokens: list[int], max_new_tokens: int, stop_strings: tuple[str, ...]
    ) -> tuple[int, FinishReason]:
        """Where this row really stopped: `generate` pads finished rows up to the longest row.

        The earlier of a stop token and the end of a stop string: a row ended by a stop string is
        padded, and the pad token can be a stop token too (Qwen3's <|endoftext|>)."""
        limit = min(len(tokens), max_new_tokens)
        stop_token_end = next((p + 1 for p in range(limit) if tokens[p] in self.stop_ids), None)
        if stop_strings:
            for position in range(1, (stop_token_end or limit) + 1):
                text = self.tokenizer.decode(tokens[:position], skip_special_tokens=False)
                if any(stop in text for stop in stop_strings):
                    return position, "stop"
        if stop_token_end is not None:
            return stop_token_end, "stop"
        return limit, "length"


class _PerRowSampling(LogitsProcessor):
    """Draws each row's next token from its own generator, seeded by its request's `seed`, and leaves
    that token the only one possible, for `generate` to take greedily.

    Why not `do_sample=True`: `generate` samples every row of a batch from the one global generator,
    so a row's draws depended on which rows shared its micro-batch, on `max_batch_size` and on how
    many problems the run held. A custom processor cannot run after `generate`'s own temperature
    and top-p warpers (it merges custom processors before them), so this one applies the same two
    warpers itself before drawing: the same distribution, per row."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        # float(): the warper refuses an int, and a YAML `temperature: 1` arrives as one
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(float(temperature))])
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(self.warpers(input_ids, scores).float(), dim=-1)
        drawn = torch.stack(
            [torch.multinomial(probs[row], 1, generator=g) for row, g in enumerate(self.generators)]
        )
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, drawn, 0.0)


class VLLMEngine:
    """The same interface on vLLM (paper profile, GPUs). Install with the `gpu` extra.

    The CPU test suite checks this adapter against a stand-in `vllm` module that generates with
    `TransformersEngine` (tests/test_evaluation.py); real vLLM needs a GPU.
    """

    def __init__(self, model_path: str, tokenizer: PreTrainedTokenizerBase, **llm_kwargs: object) -> None:
        from vllm import LLM  # imported lazily: vLLM is an optional GPU dependency

        # vLLM returns the raw model's log-probabilities by default; `GenerationResult.logprobs` are
        # those of the sampling distribution (after temperature), which is vLLM's processed mode.
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.tokenizer = tokenizer
        self.llm = LLM(model=model_path, tokenizer=model_path, **llm_kwargs)
        self.stop_ids = stop_token_ids(tokenizer)
        self.stats = EngineStats()

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingConfig
    ) -> list[GenerationResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        self.stats.calls += 1
        self.stats.batch_sizes.append(len(requests))
        call_seeds = request_seeds(sampling.seed, len(requests))
        seeds = [r.seed if r.seed is not None else seed for r, seed in zip(requests, call_seeds, strict=True)]
        params = [
            SamplingParams(
                max_tokens=r.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
                seed=seed,
                stop=list(r.stop_strings) or None,
                include_stop_str_in_output=True,
                stop_token_ids=self.stop_ids,
                logprobs=0 if sampling.return_logprobs else None,
                skip_special_tokens=True,
            )
            for r, seed in zip(requests, seeds, strict=True)
        ]
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for output in outputs:
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            logprobs = None
            if sampling.return_logprobs and completion.logprobs is not None:
                logprobs = [
                    step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)
                ]
            reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
            results.append(GenerationResult(token_ids, completion.text, reason, logprobs))
        self.stats.generated_tokens += sum(len(r.token_ids) for r in results)
        return results
