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
    DynamicCache,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from selfcest.tokenizer import stop_token_ids

FinishReason = Literal["stop", "length"]

# `TransformersEngine._decode` drops ended rows from its batch once at most this share of the
# batch's rows goes on. Dropping copies the KV cache, so dropping at every ended row cost more than
# it saved on QA's long prompts (measured, 128 prompts in batches of 64, 2 CPU cores, 1 thread:
# `qa/test` greedy 3.5 s at 1.0, 3.0 s at 0.75, 3.4 s never dropping; `arithmetic/ood` 5.2, 4.0 and
# 9.9 s). No row's tokens depend on it (tests/test_runtime.py).
COMPACT_WHEN_LIVE_AT_MOST = 0.75


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

    def __post_init__(self) -> None:
        # Checked when the request is made, not when its micro-batch comes up: a bad request in a call
        # would otherwise fail only after the micro-batches before it had been decoded and counted.
        if not self.prompt_ids:
            raise ValueError("GenerationRequest.prompt_ids is empty")
        if self.max_new_tokens < 1:
            raise ValueError(f"GenerationRequest.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check_seed("GenerationRequest.seed", self.seed)


@dataclass
class GenerationResult:
    token_ids: list[int]
    """Generated tokens, including the stop token when one ended the turn."""
    text: str
    """Decoded `token_ids` without special tokens, the text a parser reads."""
    finish_reason: FinishReason
    """`stop`: an end-of-turn token or stop string; `length`: `max_new_tokens` ran out."""
    logprobs: list[float] | None = None
    """Log-probability of each generated token under the sampling distribution (logits / temperature).
    With top_p < 1 the two engines differ: vLLM's processed log-probabilities are renormalised over the
    nucleus, `TransformersEngine`'s are over the whole vocabulary. No pipeline stage asks for them (GRPO
    rescores its rollouts with the policy through TRL)."""


@dataclass
class SamplingConfig:
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    seed: int = 0
    """Seeds sampling; the same batch with the same seed gives the same tokens. A request with its own
    `seed` (the runtime gives every request one, `keyed_seed` of this seed and the request's key)
    draws from that alone; otherwise request i of a call draws from `request_seeds(seed, n)[i]`."""
    return_logprobs: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        _check_seed("SamplingConfig.seed", self.seed)


def _check_seed(field: str, seed: int | None) -> None:
    """A seed is a non-negative integer. Why checked: `keyed_seed` (numpy's `SeedSequence`) refuses a
    negative one while torch takes it, so a negative call seed worked for a one-request call and
    failed for a longer one."""
    if seed is not None and seed < 0:
        raise ValueError(f"{field} must be a non-negative integer, got {seed}")


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


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a batch of prompts, each right-aligned after `pad_id`s."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


class TransformersEngine:
    """Batched, KV-cached, left-padded generation with a transformers model (CPU or GPU).

    Each request keeps its own budget and stop strings, and leaves the batch as soon as it ends
    (`_decode`), so a micro-batch costs its rows' own tokens, not its longest row's times its size.
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
        # A sampled request without its own seed draws from its place in the call, as on vLLM: no row
        # depends on which rows share its micro-batch.
        seeds = [None] * len(requests)
        if sampling.temperature > 0:
            call_seeds = request_seeds(sampling.seed, len(requests))
            seeds = [r.seed if r.seed is not None else s for r, s in zip(requests, call_seeds, strict=True)]
        for stop_strings, indices in groups.items():
            for start in range(0, len(indices), self.max_batch_size):
                chunk = indices[start : start + self.max_batch_size]
                self.stats.batch_sizes.append(len(chunk))
                outputs = self._generate_batch(
                    [requests[i] for i in chunk], [seeds[i] for i in chunk], stop_strings, sampling
                )
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
        seeds: list[int | None],
        stop_strings: tuple[str, ...],
        sampling: SamplingConfig,
    ) -> list[GenerationResult]:
        input_ids, attention_mask = left_padded([r.prompt_ids for r in requests], self.pad_id)
        sampler = None
        if sampling.temperature > 0:
            sampler = _PerRowSampling(
                [s for s in seeds if s is not None], sampling.temperature, sampling.top_p, self.device
            )
        rows = self._decode(
            input_ids,
            attention_mask,
            budgets=[r.max_new_tokens for r in requests],
            stop_strings=stop_strings,
            sampler=sampler,
            logprob_temperature=(sampling.temperature if sampler else 1.0)
            if sampling.return_logprobs
            else None,
        )
        return [
            GenerationResult(
                token_ids=row.tokens,
                text=self.tokenizer.decode(row.tokens, skip_special_tokens=True),
                finish_reason=row.finish_reason,
                logprobs=row.logprobs if sampling.return_logprobs else None,
            )
            for row in rows
        ]

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        budgets: list[int],
        stop_strings: tuple[str, ...],
        sampler: _PerRowSampling | None,
        logprob_temperature: float | None,
    ) -> list[_DecodedRow]:
        """KV-cached decoding of a left-padded batch that drops rows from the batch as they end.

        Why not `PreTrainedModel.generate`: it keeps a finished row in the batch, padded, until the
        batch's last row ends, and one batch's turns differ in length by up to ten times (one clone
        answers in 5 tokens, its sibling works for 90). A decoding step of the tiny model costs about
        6.5 ms plus 0.26 ms per row (2 CPU cores, 1 thread), so the padded rows were much of a long
        batch's work: the `arithmetic/ood` cell of `warmup_model` ran its methods in 194 s against
        255 s, with the same episodes. The loop is otherwise `generate`'s greedy loop (its prefill,
        position ids, mask and float32 logits), which `tests/test_runtime.py` checks token for token
        against `generate`. Which rows share a step can move a logit in its last bits (measured:
        log-probabilities within 1e-5, the same tokens), never from one run to the next: the batches
        and the steps at which rows are dropped depend on the requests alone."""
        device = self.device
        rows = [_DecodedRow() for _ in budgets]
        active = torch.arange(len(budgets))  # the batch's rows, as indices into `rows`
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0).to(device)
        # as `generate`: a batch without padding runs without a mask (the causal mask alone)
        mask = None if bool((attention_mask == 1).all()) else attention_mask.to(device)
        cache = DynamicCache(config=self.model.config)
        step_input = input_ids.to(device)
        for _ in range(max(budgets)):
            logits = (
                self.model(
                    input_ids=step_input,
                    attention_mask=mask,
                    position_ids=position_ids,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1]
                .to(dtype=torch.float32)
            )
            batch_rows = active.tolist()
            chosen = logits.argmax(-1) if sampler is None else sampler.draw(logits, batch_rows)
            if logprob_temperature is not None:
                logprobs = torch.log_softmax(logits / logprob_temperature, dim=-1)
                chosen_logprobs = logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
            live: list[int] = []  # the batch positions whose rows go on
            for position, (index, token) in enumerate(zip(batch_rows, chosen.tolist(), strict=True)):
                row = rows[index]
                if row.finish_reason is not None:  # ended at an earlier step, not yet dropped
                    continue
                row.tokens.append(token)
                if logprob_temperature is not None:
                    row.logprobs.append(chosen_logprobs[position])
                if token in self.stop_ids or (
                    stop_strings
                    and any(
                        stop in self.tokenizer.decode(row.tokens, skip_special_tokens=False)
                        for stop in stop_strings
                    )
                ):
                    row.finish_reason = "stop"
                elif len(row.tokens) >= budgets[index]:
                    row.finish_reason = "length"
                else:
                    live.append(position)
            if not live:
                break
            if len(live) <= COMPACT_WHEN_LIVE_AT_MOST * len(active):
                kept = torch.tensor(live, device=device)
                cache.batch_select_indices(kept)
                active = active[torch.tensor(live)]
                chosen = chosen[kept]
                position_ids = position_ids[kept]
                if mask is not None:
                    mask = mask[kept]
            step_input = chosen.unsqueeze(-1)
            position_ids = position_ids[:, -1:] + 1
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        return rows


class _PerRowSampling:
    """Draws each row's next token from its own generator, seeded by its request's `seed`.

    Why not one generator for the batch (`generate`'s `do_sample=True`): a row's draws then depended
    on which rows shared its micro-batch, on `max_batch_size` and on how many problems the run held.
    The temperature and top-p warpers are transformers' own: the same distribution, per row."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        # float(): the warper refuses an int, and a YAML `temperature: 1` arrives as one
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(float(temperature))])
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def draw(self, scores: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """One token per row of `scores`; `rows[i]` is the request (generator) of row i."""
        no_ids = torch.empty(
            (scores.shape[0], 0), dtype=torch.long, device=scores.device
        )  # unused by both warpers
        probs = torch.softmax(self.warpers(no_ids, scores).float(), dim=-1)
        return torch.cat(
            [torch.multinomial(probs[i], 1, generator=self.generators[row]) for i, row in enumerate(rows)]
        )


@dataclass
class _DecodedRow:
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    """None while the row runs: every row ends by its budget at the latest (`_decode` runs the
    longest budget's steps)."""
    logprobs: list[float] = field(default_factory=list)


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
