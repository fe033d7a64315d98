"""Budget-sweep evaluation: every method through the same runtime and the same token accounting.

A *method* is a way of using a checkpoint (see `MethodSpec`):

- `monolithic`: one root without tools (base, thinking, noclone-grpo); with `samples > 1` it is
  self-consistency (sc@k): k sampled solutions and a majority vote over their answers;
- `delegate`: the root has the `spawn_clone` tool (prompted, selfcest, selfcest-nogate);
- `rag`: multi-hop QA by BM25 retrieval over the question's own paragraphs, then a monolithic
  reader on the retrieved paragraphs only, one retrieve-then-read round per hop (agentic RAG).

A *budget* is a tree-wide cap on generated tokens per problem: everything the method generates
for one problem (roots, clones, every sample of sc@k, every hop of RAG) counts against it, and the
runtime makes overrunning impossible. sc@k shares the budget between its samples by default
(`split_budget`), RAG between its hops, so that every method at budget B spends at most B.

Costs per problem (`ProblemResult`): generated tokens, total tokens (generated plus every prompt
token each agent read), critical-path tokens (the longest chain of tokens that had to be generated
one after another) and wall time. Several episodes for one problem combine as follows: sc@k sums
generated and total tokens and takes the max critical path (the samples run in parallel); RAG sums
all three (the hops run in sequence); avg@k (AIME) averages everything over its independent runs.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import multiprocessing
import os
import random
import re
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from selfcest.data.qa import record_documents
from selfcest.engine import EngineStats, GenerationEngine, SamplingConfig, keyed_seed
from selfcest.param_checks import check_keys, int_setting
from selfcest.prompts import ANSWER_MARKER, THINKING_SYSTEM_PROMPT, qa_monolithic_question
from selfcest.protocol import strip_tool_calls
from selfcest.runtime import Episode, Runtime, RuntimeConfig, Task
from selfcest.scoring import (
    last_boxed,
    math_equivalent,
    math_final_answer,
    normalize_answer,
    parse_last_integer,
)
from selfcest.stats import bootstrap_ci
from selfcest.sweep_config import DATASETS
from selfcest.tasks import qa_task, score_final_answer

log = logging.getLogger(__name__)

Dataset = Literal["arithmetic", "qa", "math"]
Mode = Literal["monolithic", "delegate", "rag"]


# --------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One evaluation problem, whatever its source."""

    id: str
    dataset: str
    question: str
    """Arithmetic: the paper's prompt; QA: the bare question; math: the problem statement."""
    golds: list[str]
    """Gold answer first, then aliases (QA)."""
    documents: dict[str, str] = field(default_factory=dict)
    """QA paragraphs by key, in the record's order."""
    num_hops: int = 1


def select_indices(total: int, max_problems: int | None, seed: int) -> list[int]:
    """Indices of the problems to evaluate: all, or a seeded subset of `max_problems`, in file order.

    The subset is a prefix of one seeded permutation, so raising `max_problems` only adds problems.
    """
    if max_problems is None or max_problems >= total:
        return list(range(total))
    order = list(range(total))
    random.Random(seed).shuffle(order)
    return sorted(order[: max(0, max_problems)])


def problem_from_record(dataset: str, record: Mapping[str, Any]) -> Problem:
    """A `Problem` from one record of the project's arithmetic or unified QA schema, or a MATH/AIME line."""
    if dataset == "arithmetic":
        from selfcest.prompts import arithmetic_question

        return Problem(
            str(record["id"]), dataset, arithmetic_question(record["expr"]), [str(record["answer"])]
        )
    if dataset == "qa":
        documents = record_documents(record)
        return Problem(
            str(record["id"]),
            dataset,
            record["question"],
            [str(a) for a in record["answers"]],
            documents,
            max(1, int(record.get("num_hops") or len(record.get("hops") or []) or 1)),
        )
    if dataset == "math":
        gold = record.get("answer")
        if gold is None or str(gold).strip() == "":
            gold = last_boxed(record.get("solution", ""))
        if gold is None:
            raise ValueError(f"math record without an answer: {str(record)[:200]}")
        rid = record.get("id", record.get("unique_id", record.get("idx")))
        return Problem(str(rid), dataset, str(record["problem"]), [str(gold).strip()])
    raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")


def load_problems(dataset: str, path: str | Path, *, max_problems: int | None, seed: int) -> list[Problem]:
    """Read a JSONL split and keep `max_problems` of it (see `select_indices`).

    A record without an id (AIME 2025) is named by its line: `<dataset>-<line index>`.
    """
    records, lines = [], []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {line_number}: not a JSON record ({error.msg})") from error
            lines.append(line_number)
    problems = []
    for index in select_indices(len(records), max_problems, seed):
        try:
            problem = problem_from_record(dataset, records[index])
        except (KeyError, TypeError, ValueError) as error:
            detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
            raise ValueError(f"{path}, line {lines[index]}: {detail}") from error
        if problem.id in ("None", ""):
            problem.id = f"{dataset}-{index}"
        problems.append(problem)
    return problems


# --------------------------------------------------------------------------- methods
@dataclass
class MethodSpec:
    """How one method uses its checkpoint; built from `eval.models.<checkpoint>.<method>` params."""

    name: str
    mode: Mode = "monolithic"
    system_prompt: Literal["default", "thinking"] = "default"
    """`thinking` swaps in THINKING_SYSTEM_PROMPT (serial solve-then-check reasoning)."""
    samples: int = 1
    """k > 1: self-consistency, k sampled solutions and a majority vote."""
    temperature: float = 0.0
    top_p: float = 1.0
    split_budget: bool = True
    """sc@k: each sample gets budget // k (the problem's budget is tree-wide); False: each gets it all."""
    root_max_tokens: int | None = None
    """Cap on one root turn. None: the (per-sample) budget for tool-less roots, `runtime.root_max_tokens`
    for delegating ones (the cap they were trained with)."""
    top_k: int = 3
    """RAG: paragraphs retrieved per hop."""
    max_hops: int = 2
    """RAG: retrieve-then-read rounds, at most; a question gets min(its hop count, max_hops)."""
    datasets: list[str] | None = None
    """Datasets the method applies to (None: all). RAG applies to QA only."""

    def __post_init__(self) -> None:
        if self.mode not in ("monolithic", "delegate", "rag"):
            raise ValueError(f"method {self.name}: unknown mode {self.mode!r}")
        # An integer, or `range(2.5)` would fail in the runtime, after the cell's other units ran.
        self.samples = int_setting(self.samples, f"method {self.name}: samples", minimum=1)
        # As `SamplingConfig` checks them, but here, before the cell's first unit, naming the method.
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or self.temperature < 0
        ):
            raise ValueError(
                f"method {self.name}: temperature must be a number >= 0, got {self.temperature!r}"
            )
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise ValueError(f"method {self.name}: top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(f"method {self.name}: {self.samples} samples need a temperature > 0")
        # Settings a mode would accept and then not read refuse here, or the method runs as another
        # one under its name: the thinking prompt replaces the monolithic system prompt only (a
        # delegating root keeps the root prompt it was trained with), RAG answers once per problem
        # (no vote), and its hops and retrieved paragraphs are counts of at least one.
        if self.system_prompt not in ("default", "thinking"):
            raise ValueError(
                f"method {self.name}: system_prompt must be default or thinking, got {self.system_prompt!r}"
            )
        if self.system_prompt == "thinking" and self.mode != "monolithic":
            raise ValueError(f"method {self.name}: system_prompt thinking applies to mode monolithic only")
        if self.mode == "rag":
            if self.samples != 1:
                raise ValueError(f"method {self.name}: mode rag answers once (samples 1), got {self.samples}")
            for setting in ("top_k", "max_hops"):
                int_setting(getattr(self, setting), f"method {self.name}: {setting}", minimum=1)
        if self.mode == "rag" and self.datasets is None:
            self.datasets = ["qa"]
        if self.mode == "rag" and set(self.datasets or []) - {"qa"}:
            raise ValueError(
                f"method {self.name}: mode rag retrieves QA paragraphs, so its datasets can only be "
                f"[qa], got {self.datasets}"
            )

    @classmethod
    def from_params(
        cls, name: str, values: Mapping[str, Any] | None, section: str | None = None
    ) -> MethodSpec:
        """The method `name` from its params mapping; an unknown key is an error naming `section`
        (the mapping's params path, e.g. `eval.models.warmup_model.base`; default `method <name>`)."""
        check_keys(section or f"method {name}", values, {f.name for f in fields(cls)} - {"name"})
        return cls(name=name, **dict(values or {}))

    def applies_to(self, dataset: str) -> bool:
        return self.datasets is None or dataset in self.datasets


# --------------------------------------------------------------------------- scoring and voting
def episode_answer_text(episode: Episode) -> str:
    """What the root finally said, for math's `\\boxed{}`: its last turn without tool calls when that
    turn ended of itself (with an answer or without one), else its extracted answer, which is None
    for a root cut by a token limit or failed: a cut line ("Answer: 20" of 204) or a box inside a
    refused tool call is no answer on math either, as on arithmetic and QA.

    The text is handed on whole, box or no box: the scorer (`math_final_answer`) reads its last box,
    else its last `Answer:` line, which is the root's `final_answer` (the runtime took it from this
    very text), so looking for the box here as well would only find it twice."""
    if episode.root.status in ("ok", "no_answer"):
        return strip_tool_calls(episode.final_text)
    return f"{ANSWER_MARKER} {episode.final_answer}" if episode.final_answer else ""


def score_answer(problem: Problem, answer: str | None, text: str = "") -> tuple[float, float | None]:
    """(correctness in {0, 1}, QA token F1 or None). `answer` is the text after the final `Answer:`."""
    if problem.dataset in ("arithmetic", "qa"):
        return score_final_answer(problem.dataset, answer, problem.golds)
    return float(
        math_equivalent(text or (f"{ANSWER_MARKER} {answer}" if answer else ""), problem.golds[0])
    ), None


# `\left(?![a-zA-Z])`: sizing commands only, not the start of `\leftarrow` or `\rightarrow`.
_MATH_NOISE = re.compile(r"[\s$]|\\[,;!]|\\left(?![a-zA-Z])|\\right(?![a-zA-Z])|\\text\{\s*\}")


def answer_key(dataset: str, answer: str | None, text: str = "") -> Hashable | None:
    """What two answers must share to count as the same vote; None means no usable answer."""
    if dataset == "arithmetic":
        return parse_last_integer(answer)
    if dataset == "qa":
        return (normalize_answer(answer) or None) if answer else None
    content = math_final_answer(text) or math_final_answer(f"{ANSWER_MARKER} {answer}" if answer else None)
    if not content:
        return None
    key = _MATH_NOISE.sub("", content)
    # isascii: str.isdigit() also accepts superscripts such as "²". Leading zeros are stripped as
    # text, not by int(), which refuses strings of over 4,300 digits (a box may hold 20,000 chars).
    return (key.lstrip("0") or "0") if key.isascii() and key.isdigit() else (key or None)


def math_vote_keys(keys: Sequence[Hashable | None]) -> list[Hashable | None]:
    """sc@k on math: merge the vote keys of answers that the scorer counts as the same answer.

    `answer_key` only strips LaTeX spacing, so "\\dfrac{1}{2}", "\\frac12" and "0.5" arrive as three
    keys and a majority split across spellings could lose to a minority that agrees on one. Each key
    joins the first earlier group whose first key math-verify finds equivalent (`math_equivalent`, the
    same test that scores the winner), so the vote counts answers as the scorer does. At most k(k-1)/2
    comparisons for k samples, each bounded by the scorer's own timeout.
    """
    representatives: list[str] = []
    merged: list[Hashable | None] = []
    for key in keys:
        if key is None:
            merged.append(None)
            continue
        text = str(key)
        match = next(
            (rep for rep in representatives if rep == text or math_equivalent(f"\\boxed{{{text}}}", rep)),
            None,
        )
        if match is None:
            representatives.append(text)
            match = text
        merged.append(match)
    return merged


def vote_keys(dataset: str, group: Sequence[Episode]) -> list[Hashable | None]:
    """Each sample's vote in sc@k, in sample order: equal keys are the same answer."""
    keys = [answer_key(dataset, e.final_answer, episode_answer_text(e)) for e in group]
    return keys if dataset in ("arithmetic", "qa") else math_vote_keys(keys)


def majority_vote(keys: Sequence[Hashable | None]) -> int | None:
    """Index of the sample whose answer wins the vote; None when no sample has an answer.

    The most frequent non-None key wins; a tie goes to the key that appeared first, and the
    winning key is represented by its first sample. Deterministic for a given order of samples.
    """
    counts = Counter(key for key in keys if key is not None)
    if not counts:
        return None
    first_seen = {}
    for index, key in enumerate(keys):
        if key is not None and key not in first_seen:
            first_seen[key] = index
    best = max(counts, key=lambda key: (counts[key], -first_seen[key]))
    return first_seen[best]


# --------------------------------------------------------------------------- metrics
@dataclass
class ProblemResult:
    """One method's outcome on one problem, costs already combined over its episodes."""

    problem_id: str
    answer: str | None
    correct: float
    f1: float | None
    generated_tokens: float
    total_tokens: float
    critical_path_tokens: float
    latency_seconds: float
    """The problem's own episode wall time (batched with the others, so an upper bound on latency)."""
    clones: float
    protocol_error_rate: float
    """Share of this problem's episodes with at least one protocol error."""
    episodes: list[Episode]
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(
    results: Sequence[ProblemResult], *, seconds: float, resamples: int, seed: int
) -> dict[str, Any]:
    """One sweep row's numbers: accuracy with a bootstrap 95% interval (EM for QA, plus F1) and mean costs."""
    n = len(results)

    def mean(values: Iterable[float]) -> float:
        values = list(values)
        return float(sum(values) / len(values)) if values else math.nan

    correct = [r.correct for r in results]
    low, high = bootstrap_ci(correct, resamples=resamples, seed=seed)
    row: dict[str, Any] = {
        "n": n,
        "accuracy": mean(correct),
        "ci_low": low,
        "ci_high": high,
        "gen_tokens": mean(r.generated_tokens for r in results),
        "total_tokens": mean(r.total_tokens for r in results),
        "critical_tokens": mean(r.critical_path_tokens for r in results),
        "seconds": seconds / n if n else math.nan,
        "latency_seconds": mean(r.latency_seconds for r in results),
        "clones": mean(r.clones for r in results),
        "protocol_error_rate": mean(r.protocol_error_rate for r in results),
    }
    f1 = [r.f1 for r in results if r.f1 is not None]
    if f1:
        f1_low, f1_high = bootstrap_ci(f1, resamples=resamples, seed=seed)
        row.update(f1=mean(f1), f1_ci_low=f1_low, f1_ci_high=f1_high)
    return row


# --------------------------------------------------------------------------- retrieval
class BM25Ranker:
    """BM25 (the maintained `bm25s` package) over one question's paragraphs, "title text" each."""

    def __init__(self, documents: Mapping[str, str]) -> None:
        import bm25s  # deferred: only RAG needs it

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
        self._bm25s = bm25s
        self.keys = list(documents)
        self.retriever = None
        corpus = [f"{key.replace('-', ' ')} {text}" for key, text in documents.items()]
        tokens = self._tokenize(corpus) if corpus else None
        if tokens is not None and any(tokens.ids):  # bm25s cannot index a corpus without a single word
            self.retriever = bm25s.BM25()
            self.retriever.index(tokens, show_progress=False)

    def _tokenize(self, texts: list[str]) -> Any:
        return self._bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def rank(self, query: str, exclude: Iterable[str] = ()) -> list[str]:
        """Every key, best match first, without `exclude`; ties (and a query without any indexed
        word) keep the paragraphs' own order."""
        excluded = set(exclude)
        fallback = [k for k in self.keys if k not in excluded]
        if self.retriever is None:
            return fallback
        tokens = self._tokenize([query])
        if not tokens.ids or not tokens.ids[0]:
            return fallback
        ranked, scores = self.retriever.retrieve(tokens, k=len(self.keys), show_progress=False, n_threads=1)
        order = sorted(range(len(self.keys)), key=lambda i: (-float(scores[0][i]), int(ranked[0][i])))
        return [self.keys[int(ranked[0][i])] for i in order if self.keys[int(ranked[0][i])] not in excluded]


# --------------------------------------------------------------------------- running methods
def runtime_config_from_params(params: Mapping[str, Any] | None) -> RuntimeConfig:
    """A `RuntimeConfig` from the `runtime:` params section. An unknown key is an error: a misspelt
    limit (`max_clone_per_call`) would otherwise run the whole sweep on the default, unnoticed."""
    check_keys("runtime", params, {f.name for f in fields(RuntimeConfig)})
    return RuntimeConfig(**dict(params or {}))


def slim_episode(episode: Episode) -> dict[str, Any]:
    """The episode record without per-token arrays (token ids, masks, log-probs): texts and counts."""
    record = episode.to_dict()
    for agent in record["agents"]:
        for key in ("token_ids", "generated_mask", "logprobs"):
            agent.pop(key, None)
    return record


class Evaluator:
    """Runs methods on problems at a budget with one engine; the same runtime for every method."""

    def __init__(
        self,
        engine: GenerationEngine,
        runtime: RuntimeConfig | None = None,
        *,
        seed: int = 0,
        avg_k: int = 1,
        avg_temperature: float = 0.6,
        avg_top_p: float = 0.95,
    ) -> None:
        self.engine = engine
        self.runtime = runtime or RuntimeConfig()
        self.seed = seed
        self.avg_k = avg_k
        """avg@k (AIME): single-answer methods run k independent sampled attempts per problem."""
        self.avg_temperature = avg_temperature
        self.avg_top_p = avg_top_p

    # ------------------------------------------------------------------ config
    def config_for(self, spec: MethodSpec, budget: int) -> RuntimeConfig:
        use_tools = spec.mode == "delegate"
        config = RuntimeConfig(**{f.name: getattr(self.runtime, f.name) for f in fields(RuntimeConfig)})
        config.use_tools = use_tools
        config.episode_token_budget = budget
        if spec.root_max_tokens is not None:
            config.root_max_tokens = spec.root_max_tokens
        elif not use_tools:
            config.root_max_tokens = budget
        if spec.system_prompt == "thinking":
            config.monolithic_system_prompt = THINKING_SYSTEM_PROMPT
        return config

    @staticmethod
    def task_for(problem: Problem, mode: Mode) -> Task:
        if problem.dataset == "qa":
            return qa_task(
                problem.id,
                problem.question,
                problem.documents,
                "delegate" if mode == "delegate" else "monolithic",
            )
        return Task(problem.id, problem.question)

    # ------------------------------------------------------------------ one (method, budget)
    def run(
        self, spec: MethodSpec, problems: Sequence[Problem], budget: int
    ) -> tuple[list[ProblemResult], float]:
        """Results per problem (in order) and the wall seconds the whole batch took."""
        started = time.perf_counter()
        if spec.mode == "rag":
            results = self._run_rag(spec, problems, budget)
        else:
            results = self._run_sampled(spec, problems, budget)
        return results, time.perf_counter() - started

    def _run_sampled(self, spec: MethodSpec, problems: Sequence[Problem], budget: int) -> list[ProblemResult]:
        vote = spec.samples > 1
        if vote:
            k = spec.samples
            per_sample = budget // k if spec.split_budget else budget
            sampling = SamplingConfig(temperature=spec.temperature, top_p=spec.top_p, seed=self.seed)
        elif self.avg_k > 1:
            k, per_sample = self.avg_k, budget
            temperature = spec.temperature if spec.temperature > 0 else self.avg_temperature
            top_p = spec.top_p if spec.temperature > 0 else self.avg_top_p
            sampling = SamplingConfig(temperature=temperature, top_p=top_p, seed=self.seed)
        else:
            k, per_sample = 1, budget
            sampling = SamplingConfig(temperature=spec.temperature, top_p=spec.top_p, seed=self.seed)
        if per_sample < 1 or not problems:
            return [_empty_result(p) for p in problems]
        runtime = Runtime(self.engine, self.config_for(spec, per_sample))
        tasks = [self.task_for(p, spec.mode) for p in problems]
        episodes = runtime.run(tasks, sampling=sampling, num_samples=k)
        results = []
        for index, problem in enumerate(problems):
            group = episodes[index * k : (index + 1) * k]
            results.append(self._vote(problem, group) if vote else self._average(problem, group))
        return results

    def _vote(self, problem: Problem, group: list[Episode]) -> ProblemResult:
        """sc@k: the majority answer, with the costs of parallel samples."""
        texts = [episode_answer_text(e) for e in group]
        keys = vote_keys(problem.dataset, group)
        winner = majority_vote(keys)
        answer = group[winner].final_answer if winner is not None else None
        correct, f1 = score_answer(problem, answer, texts[winner] if winner is not None else "")
        return ProblemResult(
            problem.id,
            answer,
            correct,
            f1,
            **combined_costs(group, "parallel"),
            episodes=group,
            extra={"votes": [None if key is None else str(key) for key in keys], "winner": winner},
        )

    def _average(self, problem: Problem, group: list[Episode]) -> ProblemResult:
        """One attempt, or avg@k: every attempt scored, everything averaged over attempts."""
        scores = [score_answer(problem, e.final_answer, episode_answer_text(e)) for e in group]
        f1s = [f1 for _, f1 in scores if f1 is not None]
        k = len(group)
        return ProblemResult(
            problem.id,
            group[0].final_answer,
            sum(c for c, _ in scores) / k,
            sum(f1s) / len(f1s) if f1s else None,
            **combined_costs(group, "mean"),
            episodes=group,
            extra={"attempts": [None if e.final_answer is None else e.final_answer for e in group]}
            if k > 1
            else {},
        )

    def _run_rag(self, spec: MethodSpec, problems: Sequence[Problem], budget: int) -> list[ProblemResult]:
        """Agentic RAG: per hop, BM25-retrieve `top_k` new paragraphs for the question plus what the
        reader wrote so far, then let the monolithic reader answer from every paragraph retrieved.

        The problem's budget is shared between its hops: hop h gets (budget left) // (hops left).
        The last hop's answer is the answer; tokens, critical path and time add up over hops.
        """
        if any(p.dataset != "qa" for p in problems):
            raise ValueError("agentic RAG needs QA problems (paragraphs to retrieve from)")
        hops = [max(1, min(p.num_hops, spec.max_hops)) for p in problems]
        rankers = [BM25Ranker(p.documents) for p in problems]
        retrieved: list[list[str]] = [[] for _ in problems]
        notes: list[list[str]] = [[] for _ in problems]
        used = [0] * len(problems)
        episodes: list[list[Episode]] = [[] for _ in problems]
        sampling = SamplingConfig(temperature=spec.temperature, top_p=spec.top_p, seed=self.seed)
        for hop in range(max(hops, default=0)):
            by_budget: dict[int, list[int]] = {}
            for i, problem in enumerate(problems):
                if hop >= hops[i]:
                    continue
                grant = (budget - used[i]) // (hops[i] - hop)
                if grant < 1:
                    continue
                query = " ".join([problem.question, *notes[i]])
                retrieved[i] += rankers[i].rank(query, exclude=retrieved[i])[: spec.top_k]
                by_budget.setdefault(grant, []).append(i)
            for grant, indices in sorted(by_budget.items()):
                runtime = Runtime(self.engine, self.config_for(spec, grant))
                tasks = []
                for i in indices:
                    documents = {key: problems[i].documents[key] for key in retrieved[i]}
                    question = qa_monolithic_question(problems[i].question, documents)
                    tasks.append(Task(problems[i].id, question, metadata={"hop": hop + 1}))
                # Each hop its own seed: the runtime keys a request's draws by task, sample, agent and
                # turn, which every hop's episode shares (one task id, one agent, its first turn).
                hop_sampling = replace(sampling, seed=keyed_seed(self.seed, "rag-hop", hop))
                for i, episode in zip(indices, runtime.run(tasks, sampling=hop_sampling), strict=True):
                    episodes[i].append(episode)
                    used[i] += episode.generated_tokens
                    notes[i].append(episode.final_text.replace(ANSWER_MARKER, " "))
        results = []
        for i, problem in enumerate(problems):
            group = episodes[i]
            if not group:
                results.append(_empty_result(problem))
                continue
            answer = group[-1].final_answer
            correct, f1 = score_answer(problem, answer, episode_answer_text(group[-1]))
            results.append(
                ProblemResult(
                    problem.id,
                    answer,
                    correct,
                    f1,
                    **combined_costs(group, "serial"),
                    episodes=group,
                    extra={"retrieved": retrieved[i], "hops": len(group)},
                )
            )
        return results


def _error_rate(group: Sequence[Episode]) -> float:
    return sum(bool(e.protocol_errors) for e in group) / len(group) if group else 0.0


CostRule = Literal["parallel", "serial", "mean"]


def combined_costs(group: Sequence[Episode], rule: CostRule) -> dict[str, float]:
    """A problem's costs from its episodes, as `ProblemResult` keyword arguments.

    parallel (sc@k): the samples run side by side, so tokens and clones add up while the critical
        path and the latency are the slowest sample's;
    serial (agentic RAG): each hop waits for the previous one, so everything adds up;
    mean (one attempt, or avg@k): independent attempts at the same problem, so everything averages.
    """
    if not group:
        raise ValueError("combined_costs needs at least one episode")

    def total(values: Iterable[float]) -> float:
        return float(sum(values)) / (len(group) if rule == "mean" else 1)

    slowest = max if rule == "parallel" else total
    return {
        "generated_tokens": total(e.generated_tokens for e in group),
        "total_tokens": total(e.total_tokens for e in group),
        "critical_path_tokens": slowest(e.critical_path_tokens for e in group),
        "latency_seconds": slowest(e.wall_seconds for e in group),
        "clones": total(e.num_clones for e in group),
        "protocol_error_rate": _error_rate(group),
    }


def _empty_result(problem: Problem) -> ProblemResult:
    """A problem the method could not even start (a budget too small to grant any token)."""
    correct, f1 = score_answer(problem, None)
    return ProblemResult(problem.id, None, correct, f1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, [], {"skipped": True})


# --------------------------------------------------------------------------- one cell
def problem_record(problem: Problem, result: ProblemResult, *, meta: Mapping[str, Any]) -> dict[str, Any]:
    """One line of a cell's episodes.jsonl: the problem, the method's verdict and every episode."""
    return {
        **meta,
        "problem_id": problem.id,
        "question": problem.question,
        "num_hops": problem.num_hops if problem.dataset == "qa" else None,
        "golds": problem.golds,
        "answer": result.answer,
        "correct": result.correct,
        "f1": result.f1,
        "generated_tokens": result.generated_tokens,
        "total_tokens": result.total_tokens,
        "critical_path_tokens": result.critical_path_tokens,
        "latency_seconds": result.latency_seconds,
        "clones": result.clones,
        "protocol_error_rate": result.protocol_error_rate,
        "extra": result.extra,
        "episodes": [slim_episode(e) for e in result.episodes],
    }


# A forked worker reads the cell from here (set just before the pool starts): nothing large is
# pickled, and no worker re-imports torch or reloads the checkpoint.
_CELL: tuple[Evaluator, Sequence[MethodSpec], Sequence[Problem]] | None = None

Unit = tuple[int, int]
"""One (method index, budget) of a cell: the piece of work a worker runs whole."""


def _run_unit(unit: Unit) -> tuple[Unit, list[ProblemResult], float, EngineStats | None]:
    """Run one (method, budget) on the cell's problems; also what the engine did meanwhile."""
    assert _CELL is not None, "the cell is set before any unit runs"
    evaluator, methods, problems = _CELL
    stats: EngineStats | None = getattr(evaluator.engine, "stats", None)
    if stats is None:
        results, seconds = evaluator.run(methods[unit[0]], problems, unit[1])
        return unit, results, seconds, None
    before = stats.copy()
    results, seconds = evaluator.run(methods[unit[0]], problems, unit[1])
    return unit, results, seconds, stats.since(before)


def _run_units(
    evaluator: Evaluator,
    methods: Sequence[MethodSpec],
    problems: Sequence[Problem],
    units: Sequence[Unit],
    workers: int,
) -> Iterator[tuple[Unit, list[ProblemResult], float]]:
    """Yield each unit's results as it finishes: in order in this process, or from `workers` forked
    processes (each on the torch threads this process has).

    Why processes and not a bigger engine batch: the tiny model's CPU generation is one thread per
    process by choice (`eval.sweep.threads`: two threads in one process collapse when the two cores
    are shared), so a second core only helps as a second process. Why this gives the same rows as one
    process: every engine call seeds its own generator from the sampling config (`torch.manual_seed`
    inside `fork_rng`), so a unit's tokens do not depend on which units ran before it, or where.
    Why fork: the workers inherit the imported libraries and the loaded model (seconds each on this
    machine); it is refused where the platform has no fork, and the stage uses one process on a GPU.
    """
    global _CELL
    _CELL = (evaluator, methods, problems)
    try:
        if workers <= 1 or len(units) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            for unit in units:
                done, results, seconds, _ = _run_unit(unit)
                yield done, results, seconds
            return
        # Longest first (generated tokens grow with the budget), so no long unit starts last alone.
        order = sorted(units, key=lambda unit: -unit[1])
        stats = getattr(evaluator.engine, "stats", None)
        with multiprocessing.get_context("fork").Pool(min(workers, len(units))) as pool:
            for done, results, seconds, used in pool.imap_unordered(_run_unit, order):
                if stats is not None and used is not None:  # the workers' calls, where the stage reads them
                    stats.add(used)
                yield done, results, seconds
    finally:
        _CELL = None


def _unit_path(journal: Path, unit: Unit) -> Path:
    return journal / f"unit-{unit[0]:03d}-{unit[1]}.json.gz"


def load_unit(journal: Path, unit: Unit, method: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A finished unit's row and episode records from the journal, or None when it has none (or an
    unreadable one, which is then run again: a kill can only interrupt a write before its rename)."""
    path = _unit_path(journal, unit)
    if not path.exists():
        return None
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            entry = json.load(handle)
    except (OSError, EOFError, ValueError) as error:
        log.warning("journal entry %s is unreadable (%s): its unit runs again", path, error)
        return None
    if entry.get("method") != method or entry.get("budget") != unit[1]:
        log.warning("journal entry %s is for %s@%s, not %s@%d: its unit runs again",
                    path, entry.get("method"), entry.get("budget"), method, unit[1])  # fmt: skip
        return None
    return entry["row"], entry["records"]


def save_unit(
    journal: Path, unit: Unit, row: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> None:
    """Journal a finished unit: written to a temporary file, then renamed, so a kill never leaves
    half an entry under the real name."""
    path = _unit_path(journal, unit)
    partial = path.with_name(path.name + ".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as handle:
        json.dump({"method": row["method"], "budget": unit[1], "row": row, "records": records}, handle)
    os.replace(partial, path)


def evaluate_cell(
    evaluator: Evaluator,
    methods: Sequence[MethodSpec],
    problems: Sequence[Problem],
    budgets: Sequence[int],
    *,
    meta: Mapping[str, Any],
    resamples: int = 1000,
    bootstrap_seed: int = 0,
    records_out: Any | None = None,
    workers: int = 1,
    journal: Path | None = None,
) -> list[dict[str, Any]]:
    """Every method at every budget on `problems`: one sweep row per (method, budget).

    `meta` (dataset, split, checkpoint) is copied into every row and record; `records_out` (a text
    file) receives one JSON line per (method, budget, problem) when given. `workers` > 1 runs the
    (method, budget) units in that many forked processes (CPU engines only): the same rows and
    records, in the same order, but for the measured seconds.

    `journal` (a directory) makes a long cell resumable: each finished unit's row and records are
    saved there, and a unit already saved is read back instead of run, so a cell killed part-way
    (a preempted GPU job, hours into AIME avg@k) loses only the units it was running. The caller
    owns the journal's validity: it must hold only units of this very cell (the eval stage keys it
    by the cell's params, data, weights and code, as the training stages key their run folders).
    A unit's rows do not depend on which units ran before it (see `_run_units`), so a resumed cell
    gives the rows of an uninterrupted one; read-back units keep the seconds they were measured in.
    """
    units = [(index, int(budget)) for index in range(len(methods)) for budget in budgets]
    done: dict[Unit, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    if journal is not None:
        journal.mkdir(parents=True, exist_ok=True)
        for unit in units:
            entry = load_unit(journal, unit, methods[unit[0]].name)
            if entry is not None:
                done[unit] = entry
        if done:
            log.info(
                "%s: %d of %d units read back from %s", meta.get("split"), len(done), len(units), journal
            )
    todo = [unit for unit in units if unit not in done]
    for unit, results, seconds in _run_units(evaluator, methods, problems, todo, workers):
        row = {**meta, "method": methods[unit[0]].name, "budget": unit[1]}
        row.update(summarize(results, seconds=seconds, resamples=resamples, seed=bootstrap_seed))
        records = [
            problem_record(problem, result, meta={**meta, "method": row["method"], "budget": unit[1]})
            for problem, result in zip(problems, results, strict=True)
        ]
        done[unit] = (row, records)
        if journal is not None:
            save_unit(journal, unit, row, records)
        log.info(
            "%s %s budget=%d: acc=%.3f gen=%.1f crit=%.1f (%.1fs; %d/%d done)",
            meta.get("split"),
            row["method"],
            unit[1],
            row["accuracy"],
            row["gen_tokens"],
            row["critical_tokens"],
            seconds,
            len(done),
            len(units),
        )
    rows = []
    for unit in units:  # the cell's order, whatever order the units finished in
        row, records = done[unit]
        rows.append(row)
        if records_out is not None:
            for record in records:
                records_out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return rows
