"""The batched rollout runtime: whole SELFCEST episodes (root + clones), or monolithic baselines.

One scheduler runs every episode of a batch in rounds. In each round, every agent that is ready
to generate (roots of all episodes, or the clones that all roots just spawned) is sent to the
engine in ONE call, each with its own token grant. After the round, tool calls are parsed, clones
are created for the next round, and roots whose clones have all finished get one tool message
with the clones' answers and continue. Depth is 1 by default (clones have no tools); deeper trees
are an option (`max_depth`).

Token accounting is tree-wide and enforced before generation: every grant is taken out of the
episode's remaining budget (unused tokens are refunded after the round), so an episode can never
generate more than `episode_token_budget` tokens. A clone's `max_tokens` is cut to what remains;
clones that run side by side share what remains max-min fairly (`Runtime._grants`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from selfcest.engine import GenerationEngine, GenerationRequest, SamplingConfig, keyed_seed
from selfcest.halves import HALF_KEYS, expression_halves, question_expression
from selfcest.prompts import (
    ANSWER_MARKER,
    CLONE_SYSTEM_PROMPT,
    MONOLITHIC_SYSTEM_PROMPT,
    ROOT_SYSTEM_PROMPT,
    SPAWN_CLONE_TOOL,
    clone_user_message,
)
from selfcest.protocol import (
    CloneOutcome,
    ProtocolError,
    extract_answer,
    format_tool_response,
    parse_tool_calls,
    strip_tool_calls,
)

log = logging.getLogger(__name__)

AgentStatus = Literal[
    "running", "waiting", "ok", "failed", "no_answer", "truncated", "budget_exhausted", "aborted"
]
"""`failed`: the agent wrote `Answer: failed` (it followed the protocol). `aborted`: the runtime
stopped it before it answered (the round limit, or a chat template that does not re-render its
turn), so that GRPO's gate can tell the two apart by status alone."""


@dataclass
class RuntimeConfig:
    """Limits and budgets of one episode. Defaults suit the tiny model; the paper profile sets the
    release's values (30 clones per call, 10 calls per turn, 10 turns, 1024-token clones)."""

    use_tools: bool = True
    """False runs the monolithic baseline: one root, no tool schema, no clones."""
    max_clones_per_call: int = 8
    max_calls_per_turn: int = 2
    max_turns: int = 4
    """Assistant turns of a tool-using agent; its last turn cannot spawn."""
    max_depth: int = 1
    """1: clones have no tools (the release). 2+: clones may spawn clones of their own."""
    expression_halves: bool = False
    """Arithmetic prompts of a flat `+`/`-` sum: every agent holding a sum may hand its `first half`
    or `second half` to a clone by context key, cut by the runtime (`selfcest.halves`), and a clone
    handed a half holds that half. False: arithmetic tasks have no documents (the release)."""
    expression_max_depth: int = 3
    """`max_depth` of the episodes that `expression_halves` applies to (a 20-term sum halves to
    sums of 5 terms at depth 2)."""
    root_max_tokens: int = 160
    """Cap on one root turn's generation."""
    clone_max_tokens: int = 96
    """Cap on one clone's generation, whatever it is asked for."""
    default_clone_max_tokens: int = 64
    """Budget of a clone whose objective names no `max_tokens`."""
    episode_token_budget: int = 1024
    """Tree-wide cap on generated tokens per episode (roots and clones together)."""
    root_reserve_tokens: int = 16
    """Clone grants leave this many tokens of the budget for the root's final answer."""
    min_clone_tokens: int = 2
    """A clone granted fewer tokens than this is not started (it fails with budget_exhausted)."""
    tool_line_max_tokens: int = 32
    tool_message_max_tokens: int = 128
    max_rounds: int = 64
    """Bound on scheduler rounds, whatever the policy does."""
    root_system_prompt: str = ROOT_SYSTEM_PROMPT
    clone_system_prompt: str = CLONE_SYSTEM_PROMPT
    monolithic_system_prompt: str = MONOLITHIC_SYSTEM_PROMPT


@dataclass
class Task:
    """One problem for the root. `documents` are handed to clones by key, never shown to the root."""

    id: str
    question: str
    documents: dict[str, str] = field(default_factory=dict)
    system_prompt: str | None = None
    """Overrides the config's root or monolithic system prompt for this task."""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TurnRecord:
    text: str
    generated_tokens: int
    granted_tokens: int
    finish_reason: str


@dataclass
class AgentRecord:
    agent_id: str
    role: Literal["root", "clone"]
    depth: int
    parent_id: str | None
    spawn_turn: int | None
    """The parent's turn (1-based) in which this clone was spawned."""
    task: str
    context_keys: list[str]
    requested_max_tokens: int | None
    max_tokens: int
    """The agent's own generation cap after the runtime's limits (before the episode budget)."""
    token_ids: list[int] = field(default_factory=list)
    """The agent's whole context: prompt, generated turns and tool messages."""
    generated_mask: list[int] = field(default_factory=list)
    """1 where `token_ids` holds a token this agent generated."""
    logprobs: list[float] | None = None
    """Per generated token (in order), when the runtime was asked for them."""
    turns: list[TurnRecord] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    critical_path_tokens: int = 0
    answer: str | None = None
    status: AgentStatus = "running"
    failure: str | None = None
    children: list[list[int]] = field(default_factory=list)
    """Per spawn turn, the indices (into the episode's agents) of the clones spawned."""
    tool_calls: int = 0
    """Spawn calls this agent made (the episode's `num_tool_calls` counts every agent's)."""


@dataclass
class Episode:
    task_id: str
    sample_index: int
    mode: Literal["delegate", "monolithic"]
    budget: int
    agents: list[AgentRecord]
    final_answer: str | None = None
    final_text: str = ""
    generated_tokens: int = 0
    total_tokens: int = 0
    """Tokens the engine processed: each agent's context up to its last generated token (prompt and
    tool messages it read, plus what it generated), counted once. A clone refused for lack of budget
    and a tool message its agent never read count nothing."""
    critical_path_tokens: int = 0
    """Longest chain of generated tokens that depend on each other (root turns + slowest clones)."""
    wall_seconds: float = 0.0
    num_tool_calls: int = 0
    """Every agent's spawn calls: the sum of their `tool_calls`, taken when the episode closes."""
    num_clones: int = 0
    """Clones that ran (had at least one turn); a clone refused before its first turn is not one."""
    refused_clones: int = 0
    """Clones spawned but never run: refused for lack of budget (or stopped by the scheduler's round
    limit before their first turn). `num_clones + refused_clones` is every clone spawned."""
    repairs: int = 0
    protocol_errors: list[dict[str, Any]] = field(default_factory=list)
    budget_exhausted: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> AgentRecord:
        return self.agents[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _State:
    """Mutable bookkeeping of one episode while it runs."""

    episode: Episode
    task: Task
    remaining: int
    messages: list[list[dict[str, str]]]
    """Chat messages per agent, to render tool messages with the model's own template."""
    rendered: list[str]
    """The text each agent's `token_ids` decode to, for prefix checks; without the special token that
    ended its last turn, which the chat template writes as its own end-of-turn marker."""
    processed: dict[int, int] = field(default_factory=dict)
    """Per agent, how many of its `token_ids` the engine has read or written (its last turn's end)."""
    ready: list[int] = field(default_factory=list)
    started: float = 0.0
    done: bool = False
    documents: list[dict[str, str]] = field(default_factory=list)
    """Per agent, the documents it may hand its clones by key."""
    halves: bool = False
    """Whether the episode's agents hand halves of their sums (`RuntimeConfig.expression_halves`)."""
    invalid_objectives: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    """Per waiting agent, the (place, reason) of the unusable objectives of its last spawn turn."""
    copy: int = 0
    """How many earlier episodes of the same call have this one's task id and sample index (GRPO
    passes each prompt once per rollout): part of its requests' sampling key."""


class Runtime:
    """Runs batches of episodes on one `GenerationEngine` with the same token accounting for all methods."""

    def __init__(self, engine: GenerationEngine, config: RuntimeConfig) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config = config
        # The template's end-of-turn marker is one of these; longest first so no marker is cut short.
        self._special_tokens_longest_first = sorted(self.tokenizer.all_special_tokens, key=len, reverse=True)
        # Strings the tokenizer encodes as its added (control) tokens: <|im_end|>, <tool_call>, ...
        self._control_strings = sorted(self.tokenizer.get_added_vocab(), key=len, reverse=True)

    # ------------------------------------------------------------------ public
    def run(
        self,
        tasks: Sequence[Task],
        *,
        sampling: SamplingConfig | None = None,
        num_samples: int = 1,
        show_progress: bool = False,
    ) -> list[Episode]:
        """One episode per (task, sample), in task-major order."""
        sampling = sampling or SamplingConfig()
        states = [self._start(task, sample) for task in tasks for sample in range(num_samples)]
        copies: dict[tuple[str, int], int] = {}
        for state in states:
            key = (state.task.id, state.episode.sample_index)
            state.copy = copies.get(key, 0)
            copies[key] = state.copy + 1
        for round_index in range(self.config.max_rounds):
            if not self._round(states, sampling, round_index):
                break
            if show_progress:
                finished = sum(state.done for state in states)
                log.info("round %d: %d/%d episodes finished", round_index + 1, finished, len(states))
        for state in states:
            if not state.done:
                self._abort_unfinished(state)
        return [state.episode for state in states]

    # ------------------------------------------------------------------ episode set-up
    def _start(self, task: Task, sample_index: int) -> _State:
        config = self.config
        mode: Literal["delegate", "monolithic"] = "delegate" if config.use_tools else "monolithic"
        default_system = config.root_system_prompt if config.use_tools else config.monolithic_system_prompt
        messages = [
            {"role": "system", "content": task.system_prompt or default_system},
            {"role": "user", "content": task.question},
        ]
        root = AgentRecord(
            agent_id="root",
            role="root",
            depth=0,
            parent_id=None,
            spawn_turn=None,
            task=task.question,
            context_keys=[],
            requested_max_tokens=None,
            max_tokens=config.episode_token_budget,
        )
        episode = Episode(
            task_id=task.id,
            sample_index=sample_index,
            mode=mode,
            budget=config.episode_token_budget,
            agents=[root],
            metadata=dict(task.metadata),
        )
        state = _State(
            episode, task, config.episode_token_budget, [messages], [""], started=time.perf_counter()
        )
        documents = dict(task.documents)
        expression = question_expression(task.question) if config.expression_halves else None
        halves = expression_halves(expression) if expression is not None else {}
        state.halves = bool(halves) and config.use_tools
        if state.halves:
            documents.update(halves)
        state.documents.append(documents)
        self._set_prompt(state, 0)
        state.ready.append(0)
        return state

    def _tools_for(self, state: _State, agent: AgentRecord) -> list[dict[str, Any]] | None:
        max_depth = self.config.expression_max_depth if state.halves else self.config.max_depth
        return [SPAWN_CLONE_TOOL] if self.config.use_tools and agent.depth < max_depth else None

    def _set_prompt(self, state: _State, index: int) -> None:
        agent = state.episode.agents[index]
        text = self.tokenizer.apply_chat_template(
            state.messages[index],
            tools=self._tools_for(state, agent),
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        agent.token_ids = list(ids)
        agent.generated_mask = [0] * len(ids)
        state.rendered[index] = text

    # ------------------------------------------------------------------ one round
    def _round(self, states: list[_State], sampling: SamplingConfig, round_index: int) -> bool:
        batch: list[tuple[_State, int, int]] = []
        for state in states:
            grants = self._grants(state)
            for index in state.ready:
                grant = grants[index]
                agent = state.episode.agents[index]
                if grant < 1 or (agent.role == "clone" and grant < self.config.min_clone_tokens):
                    if agent.max_tokens - agent.generated_tokens <= grant:
                        # Its own cap is spent (a clone that spawned and has too little left to add
                        # its clones' answers), not the episode's budget.
                        self._finish(
                            state,
                            index,
                            status="truncated",
                            failure="hit its token limit before its next turn",
                        )
                        continue
                    self._finish(state, index, status="budget_exhausted", failure="token budget exhausted")
                    state.episode.budget_exhausted = True
                    continue
                state.remaining -= grant  # reserve now, refund what is not used after the round
                batch.append((state, index, grant))
            state.ready = []
        if not batch:
            for state in states:
                self._resume_waiting(state)
            return any(state.ready for state in states)
        # Each request's draws are keyed by what it is (task, sample, copy, agent, turn), not by its
        # place in the round: a problem's samples do not change with the others run beside it.
        requests = [
            GenerationRequest(
                prompt_ids=state.episode.agents[index].token_ids,
                max_new_tokens=grant,
                seed=keyed_seed(
                    sampling.seed,
                    state.task.id,
                    state.episode.sample_index,
                    state.copy,
                    index,
                    len(state.episode.agents[index].turns),
                ),
            )
            for state, index, grant in batch
        ]
        round_sampling = SamplingConfig(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed + 1000 * round_index,
            return_logprobs=sampling.return_logprobs,
        )
        results = self.engine.generate(requests, round_sampling)
        for (state, index, grant), result in zip(batch, results, strict=True):
            tokens = result.token_ids[:grant]  # an engine may never hand back more than it was granted
            # A result cut here ended at the grant, whatever the engine said: an answer cut with it is
            # a truncated one (`_finish`), not a finished one.
            finish_reason = "length" if len(result.token_ids) > grant else result.finish_reason
            state.remaining += grant - len(tokens)
            agent = state.episode.agents[index]
            agent.token_ids.extend(tokens)
            agent.generated_mask.extend([1] * len(tokens))
            state.processed[index] = len(agent.token_ids)
            if sampling.return_logprobs:
                agent.logprobs = (agent.logprobs or []) + list(result.logprobs or [])[: len(tokens)]
            agent.generated_tokens += len(tokens)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            agent.turns.append(TurnRecord(text, len(tokens), grant, finish_reason))
            # The history keeps what the model saw, special tokens generated mid-turn included (the
            # parser reads `text`): the template must re-render it verbatim before the tool message.
            # Only the stop token that ended the turn is left out, since the template closes the turn
            # with its own marker, which need not be the token sampled (Qwen3 stops on <|im_end|> and
            # on <|endoftext|>; its template always writes <|im_end|>).
            ended_by_special = self._ended_by_special(tokens, finish_reason)
            content = self.tokenizer.decode(
                tokens[:-1] if ended_by_special else tokens, skip_special_tokens=False
            )
            state.rendered[index] += content
            self._after_turn(state, index, text, finish_reason, content)
        for state in states:
            self._resume_waiting(state)
        return any(state.ready for state in states)

    def _inert(self, text: str | None) -> str | None:
        """Model text bound for another agent's prompt (a clone's answer or failure for its parent, a
        root's task for its clone), without the strings its tokenizer encodes as control tokens.

        A model can spell `<|im_end|>` or `<tool_call>` with ordinary tokens; the prompt it lands in is
        encoded as one text, which would turn the spelling into the real token and let one agent end
        or fake a turn in another's context. Removal repeats until nothing is left to remove, since
        removing one marker can join the pieces of another (bounded: each pass shortens the text)."""
        if text is None:
            return None
        for _ in range(len(text) + 1):
            cleaned = text
            for marker in self._control_strings:
                cleaned = cleaned.replace(marker, "")
            if cleaned == text:
                break
            text = cleaned
        return text

    def _ended_by_special(self, tokens: Sequence[int], finish_reason: str | None) -> bool:
        """Whether a turn's generated `tokens` end on the special stop token that ended the turn."""
        return bool(finish_reason == "stop" and tokens and tokens[-1] in self.tokenizer.all_special_ids)

    def _grants(self, state: _State) -> dict[int, int]:
        """Tokens each ready agent of one episode may generate in its next turn: never more than the
        episode has left, whatever the order of the agents.

        A root's turn may use what is left (up to `root_max_tokens`). The clones ready in one round run
        side by side and share what is left beyond `root_reserve_tokens` max-min fairly (water-filling):
        each gets what its own cap still allows or an equal share of what the others leave, whichever is
        less. Why not first come, first served (each clone its whole cap, in objective order, as before):
        a grant is reserved for the whole turn, so the first clones' unused caps starved their siblings
        under a tight budget, and a sum whose second half got no tokens was lost though the two halves'
        real cost fitted (budget 128, trees of halves: the first clones took 64 tokens each to spawn with
        4 of them). If even an equal share is below `min_clone_tokens`, the last clones in objective
        order get nothing (they fail as budget_exhausted), so that the others can start."""
        agents = state.episode.agents
        left = {
            index: max(0, agents[index].max_tokens - agents[index].generated_tokens) for index in state.ready
        }
        grants: dict[int, int] = {}
        remaining = state.remaining
        clones: list[int] = []
        for index in state.ready:
            if agents[index].role == "root":
                grants[index] = max(0, min(self.config.root_max_tokens, left[index], remaining))
                remaining -= grants[index]
            else:
                clones.append(index)
        pool = max(0, remaining - self.config.root_reserve_tokens)
        # Clones whose own cap is below the minimum are finished by the caller on their own cap (not the
        # budget's fault); they take no share. Bounded: each pass drops one clone.
        sharing = [index for index in clones if left[index] >= self.config.min_clone_tokens]
        for index in clones:
            grants[index] = min(left[index], pool)
        while sharing:
            fair = _water_fill([left[index] for index in sharing], pool)
            if min(fair) >= self.config.min_clone_tokens:
                grants.update(zip(sharing, fair, strict=True))
                break
            grants[sharing.pop()] = 0
        return grants

    def _after_turn(self, state: _State, index: int, text: str, finish_reason: str, content: str) -> None:
        config = self.config
        agent = state.episode.agents[index]
        can_spawn = self._tools_for(state, agent) is not None
        if can_spawn:
            parsed = parse_tool_calls(
                text,
                max_calls=config.max_calls_per_turn,
                max_objectives=config.max_clones_per_call,
                known_context_keys=state.documents[index].keys(),
            )
            self._record_errors(state, agent, parsed.errors)
            state.episode.repairs += parsed.repairs
            usable = parsed.usable_calls
            if usable and len(agent.turns) >= config.max_turns:
                self._record_errors(
                    state, agent, [ProtocolError("turn_limit", "no spawning on the last turn")]
                )
            elif usable:
                agent.tool_calls += len(usable)
                objectives = [objective for call in parsed.calls for objective in call.objectives]
                for position, objective in enumerate(objectives):
                    # A clone is never started with fewer tokens than this; asking for fewer is a bad
                    # argument (the default budget applies), not the episode's budget running out.
                    if objective.max_tokens is not None and objective.max_tokens < config.min_clone_tokens:
                        detail = f"objective {position}: {objective.max_tokens} < {config.min_clone_tokens}"
                        self._record_errors(state, agent, [ProtocolError("invalid_max_tokens", detail)])
                        objective.max_tokens = None
                # Clones are numbered by their objective's place among all the turn's objectives,
                # unusable ones included, so `turn{t}_clone{i}` is the i-th objective the root wrote.
                spawned = [
                    self._spawn(
                        state, index, position, objective.task, objective.context, objective.max_tokens
                    )
                    for position, objective in enumerate(objectives)
                    if objective.invalid is None
                ]
                state.invalid_objectives[index] = [
                    (position, objective.invalid)
                    for position, objective in enumerate(objectives)
                    if objective.invalid is not None
                ]
                agent.children.append(spawned)
                agent.status = "waiting"
                state.messages[index].append({"role": "assistant", "content": content})
                state.ready.extend(spawned)
                return
        self._finish(state, index, status=None, failure=None, finish_reason=finish_reason)

    def _spawn(
        self, state: _State, parent: int, position: int, task: str, keys: list[str], requested: int | None
    ) -> int:
        config = self.config
        parent_agent = state.episode.agents[parent]
        child_index = len(state.episode.agents)
        turn = len(parent_agent.turns)
        documents = {key: state.documents[parent][key] for key in keys}
        cap = min(
            requested if requested is not None else config.default_clone_max_tokens, config.clone_max_tokens
        )
        clone = AgentRecord(
            agent_id=f"{parent_agent.agent_id}/turn{turn}_clone{position}",
            role="clone",
            depth=parent_agent.depth + 1,
            parent_id=parent_agent.agent_id,
            spawn_turn=turn,
            task=task,
            context_keys=list(keys),
            requested_max_tokens=requested,
            max_tokens=cap,
        )
        state.episode.agents.append(clone)
        state.messages.append(
            [
                {"role": "system", "content": config.clone_system_prompt},
                {"role": "user", "content": clone_user_message(self._inert(task), documents)},
            ]
        )
        state.rendered.append("")
        if state.halves and len(keys) == 1 and keys[0] in HALF_KEYS:
            # The clone holds the half it was handed, and may hand on halves of it in turn.
            state.documents.append(expression_halves(documents[keys[0]]))
        else:
            state.documents.append(dict(state.task.documents))
        self._set_prompt(state, child_index)
        return child_index

    def _finish(
        self,
        state: _State,
        index: int,
        *,
        status: AgentStatus | None,
        failure: str | None,
        finish_reason: str | None = None,
    ) -> None:
        agent = state.episode.agents[index]
        last_text = strip_tool_calls(agent.turns[-1].text if agent.turns else "")
        answer = extract_answer(last_text)
        if status is None:
            if answer is not None and answer.lower().startswith("failed"):
                status, failure = "failed", answer[len("failed") :].strip(" :()") or "clone gave up"
                answer = None
            elif answer is not None and finish_reason == "length" and _answer_line_open(last_text):
                # The token limit cut the answer's line: "Answer: 1" of a 10 is not an answer.
                status, failure = "truncated", "hit its token limit while writing its answer"
            elif answer is not None and index != 0 and not (self._inert(answer) or "").strip():
                # Its parent would read an empty answer (`_inert` removes control-token strings), as if
                # the clone had answered "": it gave no answer its parent can read.
                status, failure = "no_answer", "its answer was only control markup"
            elif answer is not None:
                status = "ok"
            elif finish_reason == "length":
                status, failure = "truncated", "hit its token limit without an answer"
            else:
                status, failure = "no_answer", "no parseable Answer:"
        agent.answer = answer if status == "ok" else None
        agent.status = status
        agent.failure = failure
        if index == 0:
            self._close_episode(state)

    def _resume_waiting(self, state: _State) -> None:
        """Give each waiting agent whose clones have all finished its tool message, and queue it."""
        if state.done:
            return
        # Deepest first: clones always come after their parent, so a clone failed here (a template
        # mismatch) is settled before its parent is looked at, and the parent resumes this round
        # instead of waiting for a round that may never come.
        for index, agent in reversed(list(enumerate(state.episode.agents))):
            if agent.status != "waiting" or index in state.ready:
                continue
            children = agent.children[-1]
            if any(state.episode.agents[c].status in ("running", "waiting") for c in children):
                continue
            # The clones and the unusable objectives fill the turn's places 0..n-1 between them.
            spawned = iter(children)
            invalid = dict(state.invalid_objectives.pop(index, []))
            outcomes = []
            for place in range(len(children) + len(invalid)):
                if place in invalid:
                    outcomes.append(CloneOutcome(None, f"invalid objective: {invalid[place]}"))
                    continue
                clone = state.episode.agents[next(spawned)]
                outcomes.append(CloneOutcome(self._inert(clone.answer), self._inert(clone.failure)))
            message = format_tool_response(
                len(agent.turns),
                outcomes,
                self.tokenizer,
                line_max_tokens=self.config.tool_line_max_tokens,
                message_max_tokens=self.config.tool_message_max_tokens,
            )
            state.messages[index].append({"role": "tool", "content": message})
            if not self._append_rendered_suffix(state, index):
                error = ProtocolError(
                    "template_mismatch", "the chat template did not re-render the turn verbatim"
                )
                self._record_errors(state, agent, [error])
                self._finish(state, index, status="aborted", failure=error.detail)
                continue
            agent.status = "running"
            state.ready.append(index)

    def _append_rendered_suffix(self, state: _State, index: int) -> bool:
        """Extend an agent's tokens with the template's rendering of the new tool message.

        The generated tokens stay exactly as sampled (training needs them); only the new suffix
        is tokenized, which requires a template that renders assistant text verbatim. Where the turn
        ended on a sampled special stop token, that token stands for the template's end-of-turn
        marker, so the suffix starts after the marker. False (and nothing appended) when the template
        does not render the turn verbatim: the caller fails this agent, not the whole batch.
        """
        agent = state.episode.agents[index]
        text = self.tokenizer.apply_chat_template(
            state.messages[index],
            tools=self._tools_for(state, agent),
            add_generation_prompt=True,
            tokenize=False,
        )
        prefix = state.rendered[index]
        remainder = text[len(prefix) :] if text.startswith(prefix) else None
        # The turn's tokens end the agent's tokens until this suffix is appended.
        if remainder is not None and self._ended_by_special(agent.token_ids, agent.turns[-1].finish_reason):
            marker = next((t for t in self._special_tokens_longest_first if remainder.startswith(t)), None)
            remainder = remainder[len(marker) :] if marker is not None else None
        if remainder is None:
            log.warning(
                "the chat template does not render agent %s's turns verbatim, so its multi-turn token "
                "accounting is impossible: the agent fails",
                agent.agent_id,
            )
            return False
        suffix_ids = self.tokenizer.encode(remainder, add_special_tokens=False)
        agent.token_ids.extend(suffix_ids)
        agent.generated_mask.extend([0] * len(suffix_ids))
        state.rendered[index] = text
        return True

    def _abort_unfinished(self, state: _State) -> None:
        for index, agent in enumerate(state.episode.agents):
            if agent.status in ("running", "waiting"):
                self._record_errors(
                    state, agent, [ProtocolError("round_limit", "scheduler round limit reached")]
                )
                if index:
                    self._finish(state, index, status="aborted", failure="round limit")
        if not state.done:
            self._finish(state, 0, status="aborted", failure="round limit")

    def _record_errors(self, state: _State, agent: AgentRecord, errors: list[ProtocolError]) -> None:
        for error in errors:
            state.episode.protocol_errors.append(
                {"agent": agent.agent_id, "turn": len(agent.turns), **error.to_dict()}
            )

    # ------------------------------------------------------------------ accounting
    def _close_episode(self, state: _State) -> None:
        episode = state.episode
        for agent in episode.agents:
            agent.prompt_tokens = len(agent.token_ids) - agent.generated_tokens
        _critical_path(episode.agents, 0)
        root = episode.root
        episode.final_answer = root.answer
        episode.final_text = root.turns[-1].text if root.turns else ""
        episode.generated_tokens = sum(a.generated_tokens for a in episode.agents)
        episode.num_tool_calls = sum(a.tool_calls for a in episode.agents)
        # Counted now that every clone has settled: a spawned clone may still be refused its first turn.
        clones = [agent for agent in episode.agents if agent.role == "clone"]
        episode.num_clones = sum(bool(agent.turns) for agent in clones)
        episode.refused_clones = len(clones) - episode.num_clones
        episode.total_tokens = sum(state.processed.values())
        episode.critical_path_tokens = root.critical_path_tokens
        episode.wall_seconds = time.perf_counter() - state.started
        if episode.generated_tokens > episode.budget:  # the grants make this impossible; keep it loud
            raise AssertionError(f"episode {episode.task_id} overran its budget")
        state.done = True


def _water_fill(demands: Sequence[int], pool: int) -> list[int]:
    """Max-min fair shares of `pool` tokens: the smallest demands are met in full, and what is left is
    split evenly between the rest (integer shares: the odd tokens go to the largest demands, and among
    equal ones to the later in order). Nothing is left over unless every demand is met."""
    grants = [0] * len(demands)
    order = sorted(range(len(demands)), key=lambda i: (demands[i], i))
    for position, i in enumerate(order):
        grants[i] = min(demands[i], pool // (len(order) - position))
        pool -= grants[i]
    return grants


def _critical_path(agents: list[AgentRecord], index: int) -> int:
    """An agent's own generated tokens plus, per spawn turn, the slowest of its clones' paths."""
    agent = agents[index]
    path = agent.generated_tokens + sum(
        max((_critical_path(agents, child) for child in spawned), default=0) for spawned in agent.children
    )
    agent.critical_path_tokens = path
    return path


def _answer_line_open(text: str) -> bool:
    """Whether the line `extract_answer` reads (the first non-blank one after the last `Answer:`
    marker, which need not be the marker's own) runs to the end of `text` (tool calls stripped)."""
    position = text.rfind(ANSWER_MARKER)
    if position < 0:
        return False
    rest = text[position + len(ANSWER_MARKER) :].lstrip().rstrip(" \t")
    return rest.splitlines() in ([], [rest])
