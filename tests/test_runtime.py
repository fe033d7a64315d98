from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scripted_policies import halving_policy, last_user

from selfcest.engine import (
    GenerationRequest,
    SamplingConfig,
    TransformersEngine,
    accelerator_name,
    resolve_device,
)
from selfcest.prompts import CLONE_SYSTEM_PROMPT, arithmetic_question
from selfcest.runtime import AgentRecord, Episode, Runtime, RuntimeConfig, Task, _water_fill
from selfcest.scripted import ScriptedEngine


def spawn(objectives: list[dict]) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
        + "\n</tool_call>"
    )


def sum_of(text: str) -> int:
    match = re.search(r"(-?\d+(?:[+-]\d+)*)", text)  # a truncated spawn can hand a clone garbage
    return sum(int(t) for t in re.findall(r"[+-]?\d+", match.group(1))) if match else 0


def splitting_policy(prompt: str) -> str:
    """Root: split a sum into pairs, then add the clones' answers. Clone: add its pair."""
    if CLONE_SYSTEM_PROMPT in prompt:
        return f"Answer: {sum_of(last_user(prompt))}"
    if "<tool_response>" in last_user(prompt):
        answers = [int(v) for v in re.findall(r"turn\d+_clone\d+: (-?\d+)", last_user(prompt))]
        return f"Answer: {sum(answers)}"
    terms = re.findall(r"\d+", prompt.rsplit("Calculate the value of", 1)[1])
    pairs = ["+".join(terms[i : i + 2]) for i in range(0, len(terms), 2)]
    return spawn([{"task": f"Calculate the value of {p}.", "max_tokens": 16} for p in pairs])


def check_accounting(episode: Episode, config: RuntimeConfig) -> None:
    assert episode.generated_tokens <= episode.budget
    assert episode.generated_tokens == sum(a.generated_tokens for a in episode.agents)
    assert episode.num_tool_calls == sum(a.tool_calls for a in episode.agents)
    # the engine read each agent's context up to its last generated token, and nothing after it
    last_generated = [
        max((i + 1 for i, m in enumerate(a.generated_mask) if m), default=0) for a in episode.agents
    ]
    assert episode.total_tokens == sum(last_generated)
    # every spawned clone either ran (had a turn) or was refused
    clones = [a for a in episode.agents if a.role == "clone"]
    assert episode.num_clones == sum(bool(a.turns) for a in clones)
    assert episode.num_clones + episode.refused_clones == len(clones)
    for agent in episode.agents:
        assert sum(agent.generated_mask) == agent.generated_tokens
        assert agent.prompt_tokens + agent.generated_tokens == len(agent.token_ids)
        assert agent.generated_tokens <= agent.max_tokens
        assert sum(t.generated_tokens for t in agent.turns) == agent.generated_tokens
        # a root turn is capped by root_max_tokens (its max_tokens is the whole episode budget)
        turn_cap = config.root_max_tokens if agent.role == "root" else agent.max_tokens
        for turn in agent.turns:
            assert 1 <= turn.granted_tokens <= turn_cap
            assert turn.generated_tokens <= turn.granted_tokens
    json.dumps(episode.to_dict())  # records are JSON-serialisable


def critical_path(agents: list[AgentRecord], agent_id: str) -> int:
    """Recomputed from parent ids and spawn turns (not `children`): an agent's own tokens plus, per
    turn in which it spawned, the longest path among that turn's clones."""
    agent = next(a for a in agents if a.agent_id == agent_id)
    waves: dict[int | None, list[str]] = {}
    for other in agents:
        if other.parent_id == agent_id:
            waves.setdefault(other.spawn_turn, []).append(other.agent_id)
    return agent.generated_tokens + sum(
        max(critical_path(agents, child) for child in wave) for wave in waves.values()
    )


def test_delegation_episode_end_to_end(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer, splitting_policy)
    config = RuntimeConfig()
    [episode] = Runtime(engine, config).run([Task("t", arithmetic_question("1+2+30+4"))])
    assert episode.final_answer == "37"
    root = episode.root
    assert [a.answer for a in episode.agents[1:]] == ["3", "34"]
    assert [a.agent_id for a in episode.agents[1:]] == ["root/turn1_clone0", "root/turn1_clone1"]
    assert episode.num_tool_calls == 1 and episode.num_clones == 2
    assert "turn1_clone0: 3\nturn1_clone1: 34" in tiny_tokenizer.decode(root.token_ids)
    # clones see only their own task
    assert "30" not in tiny_tokenizer.decode(episode.agents[1].token_ids)
    check_accounting(episode, config)
    clones = episode.agents[1:]
    expected = (
        root.turns[0].generated_tokens
        + max(c.generated_tokens for c in clones)
        + root.turns[1].generated_tokens
    )
    assert episode.critical_path_tokens == expected
    assert episode.critical_path_tokens < episode.generated_tokens


def test_clones_of_all_roots_generate_in_one_batch(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer, splitting_policy)
    tasks = [Task(str(i), arithmetic_question("+".join(str(i + j) for j in range(6)))) for i in range(3)]
    episodes = Runtime(engine, RuntimeConfig()).run(tasks)
    assert [e.final_answer for e in episodes] == [str(sum(i + j for j in range(6))) for i in range(3)]
    assert engine.stats.batch_sizes == [3, 9, 3]
    assert all(CLONE_SYSTEM_PROMPT in prompt for prompt in engine.batches[1])


def test_engine_stats_of_a_later_run_add_back_to_the_whole(tiny_tokenizer) -> None:
    """What a forked evaluation worker reports (`since` a copy) and its parent adds back (`add`)."""
    engine = ScriptedEngine(tiny_tokenizer, splitting_policy)
    runtime = Runtime(engine, RuntimeConfig())
    runtime.run([Task("a", arithmetic_question("1+2+3+4+5+6"))])
    before = engine.stats.copy()
    runtime.run([Task(str(i), arithmetic_question("+".join(str(i + j) for j in range(6)))) for i in range(2)])
    later = engine.stats.since(before)
    assert (later.calls, later.batch_sizes) == (3, [2, 6, 2])
    assert 0 < later.generated_tokens < engine.stats.generated_tokens
    before.add(later)
    assert before == engine.stats


EIGHT_ONES = arithmetic_question("+".join(["1"] * 8))


def eight_ones_spawn_tokens(tiny_tokenizer) -> int:
    """What the root's first turn on `EIGHT_ONES` costs: its spawn call and the end-of-turn token
    (112 with the test tokenizer; the budgets below are counted from it, whatever the merges)."""
    return len(tiny_tokenizer.encode(splitting_policy(EIGHT_ONES), add_special_tokens=False)) + 1


def run_eight_ones(tiny_tokenizer, config: RuntimeConfig) -> Episode:
    """The root spends its spawn tokens on four clones of 16 tokens ("1+1") that answer in 4."""
    engine = ScriptedEngine(tiny_tokenizer, splitting_policy)
    [episode] = Runtime(engine, config).run([Task("t", EIGHT_ONES)])
    check_accounting(episode, config)
    root = episode.root
    assert [t.generated_tokens for t in root.turns[:1]] == [eight_ones_spawn_tokens(tiny_tokenizer)]
    assert [len(spawned) for spawned in root.children] == [4]
    return episode


@pytest.mark.parametrize(("reserve", "grants"), [(10, [14, 14, 15, 15]), (0, [16, 16, 16, 16])])
def test_budget_cuts_clone_grants_and_is_never_exceeded(
    tiny_tokenizer, reserve: int, grants: list[int]
) -> None:
    """68 tokens are left after the root's first turn. The four clones run side by side and share
    what the root's reserve leaves: with a reserve of 10, 58 tokens, 14 + 14 + 15 + 15 (each asked
    for 16); with none, 68 covers the 4 x 16 asked. The root keeps at least its reserve."""
    spawn_tokens = eight_ones_spawn_tokens(tiny_tokenizer)
    budget = spawn_tokens + 68
    config = RuntimeConfig(episode_token_budget=budget, root_reserve_tokens=reserve, root_max_tokens=400)
    episode = run_eight_ones(tiny_tokenizer, config)
    root, clones = episode.root, episode.agents[1:]
    assert [c.max_tokens for c in clones] == [16, 16, 16, 16]
    assert [[t.granted_tokens for t in c.turns] for c in clones] == [[g] for g in grants]
    assert all(c.status == "ok" for c in clones) and episode.final_answer == "8"
    assert not episode.budget_exhausted and episode.generated_tokens <= budget
    assert root.turns[0].granted_tokens == budget  # min(root_max_tokens, budget)
    assert len(root.turns) == 2 and root.turns[-1].granted_tokens >= reserve
    # the grants were taken while the root's first turn was the only spending
    assert sum(grants) <= budget - spawn_tokens - reserve


@pytest.mark.parametrize(("min_clone_tokens", "grants"), [(3, [3, 3, 4]), (4, [5, 5])])
def test_a_clone_granted_less_than_min_clone_tokens_is_not_started(
    tiny_tokenizer, min_clone_tokens: int, grants: list[int]
) -> None:
    """20 tokens after the root's spawn leave the four clones 20 - 10 = 10: equal shares of 2-3 are
    below both minimums, so the last clones in objective order are not started (budget_exhausted,
    without generating) until the others' shares reach the minimum: three clones of 3, 3 and 4
    tokens when it is 3, two of 5 when it is 4. A clone needs 4 tokens to answer."""
    config = RuntimeConfig(
        episode_token_budget=eight_ones_spawn_tokens(tiny_tokenizer) + 20,
        root_reserve_tokens=10,
        root_max_tokens=400,
        min_clone_tokens=min_clone_tokens,
    )
    episode = run_eight_ones(tiny_tokenizer, config)
    clones = episode.agents[1:]
    started, skipped = clones[: len(grants)], clones[len(grants) :]
    assert [[t.granted_tokens for t in c.turns] for c in started] == [[g] for g in grants]
    assert [c.status for c in started] == ["ok" if g >= 4 else "truncated" for g in grants]
    assert episode.budget_exhausted
    # a clone that never ran is no clone of the episode's count, but a refused one
    assert (episode.num_clones, episode.refused_clones) == (len(started), len(skipped))
    for clone in skipped:
        assert (clone.status, clone.generated_tokens, clone.turns) == ("budget_exhausted", 0, [])
        assert clone.failure == "token budget exhausted" and clone.answer is None
        # its prompt never reached the engine, so it costs nothing
        assert clone.prompt_tokens > 0
    assert episode.total_tokens == sum(len(a.token_ids) for a in episode.agents if a.turns)
    assert "turn1_clone3: failed" in tiny_tokenizer.decode(episode.root.token_ids)
    # the root adds the answers it got
    assert episode.final_answer == str(2 * sum(c.status == "ok" for c in started))


@pytest.mark.parametrize(
    ("demands", "pool", "grants"),
    [
        ([16, 16, 16, 16], 58, [14, 14, 15, 15]),
        ([16, 16, 16, 16], 80, [16, 16, 16, 16]),
        ([64, 8, 64], 60, [26, 8, 26]),  # the small demand is met, the rest split evenly
        ([5, 5, 5], 10, [3, 3, 4]),
        ([7], 0, [0]),
        ([], 10, []),
    ],
)
def test_water_fill_is_max_min_fair(demands: list[int], pool: int, grants: list[int]) -> None:
    assert _water_fill(demands, pool) == grants
    assert sum(grants) <= pool and all(0 <= g <= d for g, d in zip(grants, demands, strict=True))


def test_a_tight_budget_is_shared_between_sibling_clones_not_taken_by_the_first(tiny_tokenizer) -> None:
    """Two clones asking 64 tokens each, 40 tokens left beyond the reserve: first come, first served
    gave the first clone 40 and left the second none, so the sum was lost though each clone needs 4;
    shared, each gets 20 and both answer."""

    def pairs_of_two(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt or "<tool_response>" in last_user(prompt):
            return splitting_policy(prompt)
        return spawn([{"task": arithmetic_question(p), "max_tokens": 64} for p in ("1+1", "2+2")])

    question = arithmetic_question("1+1+2+2")
    spawn_tokens = len(tiny_tokenizer.encode(pairs_of_two(question), add_special_tokens=False)) + 1
    config = RuntimeConfig(
        episode_token_budget=spawn_tokens + 50, root_reserve_tokens=10, root_max_tokens=400
    )
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, pairs_of_two), config).run([Task("t", question)])
    check_accounting(episode, config)
    clones = episode.agents[1:]
    assert [[t.granted_tokens for t in c.turns] for c in clones] == [[20], [20]]
    assert [c.status for c in clones] == ["ok", "ok"]
    assert episode.final_answer == "6" and not episode.budget_exhausted


def adversarial_policy(prompt: str) -> str:
    """Spams calls with many clones and huge budgets, nests calls inside clones, emits garbage."""
    if CLONE_SYSTEM_PROMPT in prompt:
        return spawn([{"task": "again", "max_tokens": 10**9}] * 40) + " {{{ not json"
    junk = (
        '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": [{"task": "x", "max_tokens": "lots"'
    )
    return (spawn([{"task": "sub", "max_tokens": 10**12, "context": ["missing"]}] * 8) * 4) + junk


@pytest.mark.parametrize("max_depth", [1, 2])
def test_adversarial_policy_cannot_break_any_limit(tiny_tokenizer, max_depth: int) -> None:
    config = RuntimeConfig(
        max_clones_per_call=5,
        max_calls_per_turn=2,
        max_turns=3,
        max_depth=max_depth,
        root_max_tokens=10_000,
        clone_max_tokens=50,
        episode_token_budget=8000,
        max_rounds=20,
    )
    engine = ScriptedEngine(tiny_tokenizer, adversarial_policy)
    [episode] = Runtime(engine, config).run([Task("t", "Do it.")])
    check_accounting(episode, config)
    root = episode.root
    assert len(root.turns) <= config.max_turns
    for agent in episode.agents:
        assert agent.depth <= max_depth
        assert agent.status not in ("running", "waiting")
        for spawned in agent.children:
            assert len(spawned) <= config.max_clones_per_call * config.max_calls_per_turn
        if agent.role == "clone":
            assert agent.max_tokens <= config.clone_max_tokens
            assert agent.requested_max_tokens is None or agent.requested_max_tokens > agent.max_tokens
            assert agent.context_keys == []
    kinds = {e["kind"] for e in episode.protocol_errors}
    assert {"too_many_calls", "too_many_clones", "unknown_context_key", "turn_limit"} <= kinds
    if max_depth == 1:
        assert all(a.depth <= 1 for a in episode.agents)
        assert all(a.status in ("no_answer", "truncated", "budget_exhausted") for a in episode.agents[1:])
    else:
        assert any(a.depth == 2 and a.generated_tokens > 0 for a in episode.agents)
    for agent in episode.agents:
        assert agent.critical_path_tokens == critical_path(episode.agents, agent.agent_id)
    assert episode.critical_path_tokens == root.critical_path_tokens
    assert root.generated_tokens < episode.critical_path_tokens < episode.generated_tokens
    assert engine.stats.calls <= config.max_rounds


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    budget=st.integers(1, 400),
    reserve=st.integers(0, 40),
    clone_cap=st.integers(1, 80),
    root_cap=st.integers(1, 200),
    n_terms=st.integers(1, 20),
)
@example(budget=300, reserve=16, clone_cap=32, root_cap=20, n_terms=8)  # root turns cut by root_cap
def test_budget_is_never_exceeded(
    tiny_tokenizer, budget: int, reserve: int, clone_cap: int, root_cap: int, n_terms: int
) -> None:
    config = RuntimeConfig(
        episode_token_budget=budget,
        root_reserve_tokens=reserve,
        clone_max_tokens=clone_cap,
        root_max_tokens=root_cap,
    )
    policies = [splitting_policy, adversarial_policy]
    for policy in policies:
        engine = ScriptedEngine(tiny_tokenizer, policy)
        episodes = Runtime(engine, config).run([Task("t", arithmetic_question("+".join(["7"] * n_terms)))])
        for episode in episodes:
            check_accounting(episode, config)


def test_monolithic_mode_has_no_tools_and_one_turn(tiny_tokenizer) -> None:
    engine = ScriptedEngine(tiny_tokenizer, lambda p: spawn([{"task": "x"}]) + "\nAnswer: 5")
    [episode] = Runtime(engine, RuntimeConfig(use_tools=False)).run(
        [Task("t", "Calculate the value of 2+3.")]
    )
    assert episode.mode == "monolithic"
    assert "<tools>" not in tiny_tokenizer.decode(episode.root.token_ids)
    assert len(episode.agents) == 1 and len(episode.root.turns) == 1
    assert episode.final_answer == "5"
    assert episode.critical_path_tokens == episode.generated_tokens


def test_documents_are_handed_to_clones_by_key_only(tiny_tokenizer) -> None:
    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return (
                "Answer: Paris"
                if "capital of Zorb is Paris" in prompt
                else "Answer: failed (not in my paragraphs)"
            )
        if "<tool_response>" in last_user(prompt):
            return "Answer: " + re.findall(r"turn1_clone\d+: (\w+)", prompt)[0]
        return spawn(
            [
                {"task": "What is the capital of Zorb?", "context": ["zorb"]},
                {"task": "same", "context": ["other"]},
            ]
        )

    task = Task(
        "q",
        "Documents: zorb, other\nWhat is the capital of Zorb?",
        documents={"zorb": "The capital of Zorb is Paris.", "other": "Unrelated text."},
    )
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()).run([task])
    assert episode.final_answer == "Paris"
    root_text = tiny_tokenizer.decode(episode.root.token_ids)
    assert "The capital of Zorb is Paris." not in root_text
    assert episode.agents[2].status == "failed" and episode.agents[2].failure == "not in my paragraphs"
    assert "turn1_clone1: failed (not in my paragraphs)" in root_text


def test_greedy_runs_on_a_real_model_are_deterministic(tiny_model, tiny_tokenizer) -> None:
    engine = TransformersEngine(tiny_model, tiny_tokenizer)
    config = RuntimeConfig(root_max_tokens=24, episode_token_budget=64)
    tasks = [Task(str(i), arithmetic_question(f"{i}+{i * 7}")) for i in range(3)]

    def strip(episodes: list[Episode]) -> list[dict]:
        return [{k: v for k, v in e.to_dict().items() if k != "wall_seconds"} for e in episodes]

    first = Runtime(engine, config).run(tasks, sampling=SamplingConfig(return_logprobs=True))
    second = Runtime(engine, config).run(tasks, sampling=SamplingConfig(return_logprobs=True))
    assert strip(first) == strip(second)
    for episode in first:
        check_accounting(episode, config)
        assert len(episode.root.logprobs) == episode.root.generated_tokens
    sampled = [
        Runtime(engine, config).run(tasks, sampling=SamplingConfig(temperature=1.0, seed=s))
        for s in (1, 1, 2)
    ]
    assert strip(sampled[0]) == strip(sampled[1])
    assert strip(sampled[0]) != strip(sampled[2])


def test_micro_batches_draw_from_their_own_random_streams(tiny_model, tiny_tokenizer) -> None:
    """Identical prompts split over micro-batches must not repeat one another's samples (each
    micro-batch used to be seeded with the call's seed, so row r of every one drew the same numbers);
    the same call with the same seed still gives the same tokens."""
    from selfcest.engine import GenerationRequest, micro_batch_seed

    prompt = tiny_tokenizer.encode(
        "<|im_start|>user\nCalculate the value of 1+2.<|im_end|>\n<|im_start|>assistant\n"
    )
    requests = [GenerationRequest(prompt, 12)] * 8
    sampling = SamplingConfig(temperature=1.0, seed=5)
    engine = TransformersEngine(tiny_model, tiny_tokenizer, max_batch_size=2)
    first = [tuple(r.token_ids) for r in engine.generate(requests, sampling)]
    assert engine.stats.batch_sizes == [2, 2, 2, 2]  # one entry per micro-batch the engine ran
    assert first == [tuple(r.token_ids) for r in engine.generate(requests, sampling)]
    assert first[0::2] != [first[0]] * 4  # row 0 of the four micro-batches: not one sample four times
    seeds = {micro_batch_seed(seed, batch) for seed in range(4) for batch in range(4)}
    assert len(seeds) == 16 and micro_batch_seed(7, 0) == 7


def test_stop_strings_are_matched_in_the_continuation_only(tiny_model, tiny_tokenizer) -> None:
    """A stop string that begins in the prompt and ends in the first generated token is not in the
    continuation: the row generates on as without it (it stopped at once, came back as `length` and,
    beside a longer row, with pad tokens counted as generated). One that the continuation holds
    stops the row where it ends, kept in the output."""
    from selfcest.engine import GenerationRequest

    engine = TransformersEngine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer, ["1+2", "3+4+5"])
    never = ("\x00",)  # a stop string nothing here decodes to: the same batches, no stop

    def decode(ids: list[int]) -> str:
        return tiny_tokenizer.decode(ids, skip_special_tokens=False)

    def sampled(stop_strings: tuple[str, ...], seed: int) -> list:
        requests = [GenerationRequest(p, 12, stop_strings) for p in prompts]
        return engine.generate(requests, SamplingConfig(temperature=1.0, seed=seed))

    # The random model's first sampled token must decode to plain text for the stop string to span it.
    for seed in range(200):
        reference = sampled(never, seed)
        first = decode(reference[0].token_ids[:1])
        spanning = "\n" + first  # the prompt ends with "assistant\n"
        if (
            first.isascii()
            and first.strip()
            and len(reference[0].token_ids) == 12
            and spanning not in decode(reference[0].token_ids)
        ):
            break
    else:
        raise AssertionError("no seed gives a plain first token")
    spanned = sampled((spanning,), seed)
    assert [(r.token_ids, r.finish_reason) for r in spanned] == [
        (r.token_ids, r.finish_reason) for r in reference
    ]
    inside = decode(reference[0].token_ids[1:3])
    stopped = sampled((inside,), seed)[0]
    assert stopped.finish_reason == "stop" and inside in decode(stopped.token_ids)
    assert stopped.token_ids == reference[0].token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) <= 3


def test_vllm_request_seeds_of_consecutive_rounds_do_not_collide() -> None:
    """The runtime seeds round r's call with seed + 1000 r; a round of 1,440 requests (48 roots x 30
    clones) must not share a request's seed with the next round's (`seed + i` did: 1000 + j and j)."""
    from selfcest.engine import request_seeds

    rounds = [request_seeds(3 + 1000 * r, 1440) for r in range(3)]
    assert len({seed for seeds in rounds for seed in seeds}) == 3 * 1440
    assert all(0 <= seed < 2**63 for seeds in rounds for seed in seeds)
    assert request_seeds(3, 4) == request_seeds(3, 4)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GenerationRequest([], 4), "prompt_ids"),
        (lambda: GenerationRequest([1, 2], 0), "max_new_tokens"),
        (lambda: GenerationRequest([1, 2], 4, seed=-1), "GenerationRequest.seed"),
        (lambda: SamplingConfig(temperature=0.7, seed=-1), "SamplingConfig.seed"),
        (lambda: SamplingConfig(temperature=-0.1), "temperature"),
        (lambda: SamplingConfig(temperature=0.7, top_p=0.0), "top_p"),
    ],
)
def test_a_bad_request_or_sampling_setting_is_refused_when_made(make, field: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=field):
        make()


def test_the_checkpoints_generation_config_does_not_leak_into_sampling(tiny_model, tiny_tokenizer) -> None:
    """Only `SamplingConfig` decides how tokens are drawn: a repetition penalty or n-gram ban saved
    in the checkpoint's generation config must not change greedy decoding (the argmax chain)."""
    import copy

    import torch

    prompt = tiny_tokenizer.encode(
        "<|im_start|>user\nCalculate the value of 3+4+5.<|im_end|>\n<|im_start|>assistant\n"
    )
    ids, argmax = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(16):
            argmax.append(int(tiny_model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[argmax[-1]]])], dim=1)
    model = copy.deepcopy(tiny_model)
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    # Fields whose global default is None were filled from the checkpoint's config all the same.
    model.generation_config.suppress_tokens = [argmax[0]]
    model.generation_config.exponential_decay_length_penalty = (1, 5.0)
    own = model.generation_config
    from selfcest.engine import GenerationRequest

    [result] = TransformersEngine(model, tiny_tokenizer).generate(
        [GenerationRequest(prompt, 16)], SamplingConfig()
    )
    engine = TransformersEngine(tiny_model, tiny_tokenizer)
    stop = next((i for i, t in enumerate(argmax) if t in engine.stop_ids), len(argmax) - 1)
    assert result.token_ids == argmax[: stop + 1]
    assert model.generation_config is own  # put back after the call


def test_a_special_token_generated_mid_turn_does_not_break_the_batch(tiny_tokenizer) -> None:
    """The root's history keeps a stray special token as generated, so the template re-renders the
    turn verbatim and the episode goes on (it used to raise and abort every episode of the batch)."""
    call = spawn([{"task": "Calculate the value of 1+2."}])

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt or "<tool_response>" in last_user(prompt):
            return "Answer: 3"
        return "1+2<|endoftext|>" + call

    tasks = [Task("a", arithmetic_question("1+2")), Task("b", arithmetic_question("2+1"))]
    config = RuntimeConfig()
    episodes = Runtime(ScriptedEngine(tiny_tokenizer, policy), config).run(tasks)
    assert [e.final_answer for e in episodes] == ["3", "3"]
    for episode in episodes:
        check_accounting(episode, config)


def test_an_answer_cut_by_the_token_limit_is_not_an_answer(tiny_tokenizer) -> None:
    """A clone whose `Answer:` line is cut by its max_tokens ("Answer: 1" of 1234) is `truncated`,
    so the root is told it failed and the training gate treats it as unfinished."""

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: 1234"
        if "<tool_response>" in last_user(prompt):
            return "Answer: 0"
        return spawn(
            [
                {"task": "Calculate the value of 1000+234.", "max_tokens": 4},
                {"task": "Say 5.", "max_tokens": 8},
            ]
        )

    engine = ScriptedEngine(tiny_tokenizer, policy)
    [episode] = Runtime(engine, RuntimeConfig()).run([Task("t", arithmetic_question("1000+234"))])
    cut, whole = episode.agents[1], episode.agents[2]
    assert cut.turns[-1].finish_reason == "length" and cut.turns[-1].text.startswith("Answer:")
    assert (cut.status, cut.answer) == ("truncated", None) and whole.status == "ok"
    assert "turn1_clone0: failed" in tiny_tokenizer.decode(episode.root.token_ids)


def test_a_turn_ended_by_the_other_end_of_sequence_token_keeps_its_clones(tiny_tokenizer) -> None:
    """Qwen3 stops on <|endoftext|> as well as <|im_end|>, while its template closes every turn with
    <|im_end|>: the sampled token stands for that marker, and the root reads its clones' answers."""
    results = {}
    for end in ("<|im_end|>", "<|endoftext|>"):
        engine = ScriptedEngine(tiny_tokenizer, splitting_policy)
        engine.end_id = tiny_tokenizer.convert_tokens_to_ids(end)
        config = RuntimeConfig()
        [episode] = Runtime(engine, config).run([Task("t", arithmetic_question("1+2+30+4"))])
        assert (episode.final_answer, episode.root.status, episode.protocol_errors) == ("37", "ok", [])
        check_accounting(episode, config)
        root_ids = episode.root.token_ids
        assert root_ids[len(root_ids) - 1 - root_ids[::-1].index(engine.end_id)] == engine.end_id
        results[end] = [a.generated_tokens for a in episode.agents]
    assert results["<|im_end|>"] == results["<|endoftext|>"]


def test_a_parent_resumes_in_the_round_its_last_clone_fails(tiny_tokenizer, monkeypatch) -> None:
    """Depth 2: the middle clone fails when its tool message cannot be appended; its parent, the
    root, must get its tool message in the same pass, not be left waiting until the round limit."""

    def policy(prompt: str) -> str:
        if "<tool_response>" in last_user(prompt):
            return "Answer: 7"
        if CLONE_SYSTEM_PROMPT in prompt:
            return spawn([{"task": "Say 7."}]) if "Delegate" in prompt else "Answer: 7"
        return spawn([{"task": "Delegate: say 7."}])

    append = Runtime._append_rendered_suffix

    def fail_the_middle_clone(self: Runtime, state, index: int) -> bool:
        return False if state.episode.agents[index].depth == 1 else append(self, state, index)

    monkeypatch.setattr(Runtime, "_append_rendered_suffix", fail_the_middle_clone)
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig(max_depth=2)).run(
        [Task("t", "Do it.")]
    )
    middle = episode.agents[1]
    assert (middle.status, middle.depth) == ("aborted", 1)
    assert (episode.root.status, episode.final_answer) == ("ok", "7")
    assert "round_limit" not in [e["kind"] for e in episode.protocol_errors]


def test_asking_a_clone_for_fewer_tokens_than_any_clone_starts_with_is_a_bad_argument(
    tiny_tokenizer,
) -> None:
    """max_tokens below `min_clone_tokens` is the root's bad argument (the default budget applies),
    not the episode running out of budget."""

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: 2"
        if "<tool_response>" in last_user(prompt):
            return "Answer: 2"
        return spawn([{"task": "Calculate the value of 1+1.", "max_tokens": 1}])

    config = RuntimeConfig(min_clone_tokens=2)
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), config).run(
        [Task("t", arithmetic_question("1+1"))]
    )
    clone = episode.agents[1]
    assert (clone.status, clone.requested_max_tokens, clone.max_tokens) == (
        "ok",
        None,
        config.default_clone_max_tokens,
    )
    assert not episode.budget_exhausted and episode.final_answer == "2"
    assert [e["kind"] for e in episode.protocol_errors] == ["invalid_max_tokens"]
    check_accounting(episode, config)


def _prompts(tokenizer, expressions: list[str]) -> list[list[int]]:
    return [
        tokenizer.encode(f"<|im_start|>user\nCalculate the value of {e}.<|im_end|>\n<|im_start|>assistant\n")
        for e in expressions
    ]


def test_the_engine_decodes_greedily_as_transformers_generate(tiny_model, tiny_tokenizer) -> None:
    """The engine's own loop (rows of several prompt lengths, left-padded, with their own budgets and
    dropped from the batch as they end) gives each row the tokens and the logits that `generate`
    gives that prompt alone."""
    import torch

    from selfcest.engine import GenerationRequest

    engine = TransformersEngine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer, ["1+2", "3+4+5-6+7", "8", "9-1+2+3+4+5+6+7+8"])
    budgets = [3, 11, 6, 17]
    results = engine.generate(
        [GenerationRequest(p, b) for p, b in zip(prompts, budgets, strict=True)],
        SamplingConfig(return_logprobs=True),
    )
    for prompt, budget, result in zip(prompts, budgets, results, strict=True):
        with torch.no_grad():
            output = tiny_model.generate(
                torch.tensor([prompt]),
                max_new_tokens=budget,
                do_sample=False,
                eos_token_id=engine.stop_ids,
                pad_token_id=engine.pad_id,
                return_dict_in_generate=True,
                output_logits=True,
            )
        sequence = output.sequences[0, len(prompt) :].tolist()
        stop = next((i + 1 for i, t in enumerate(sequence) if t in engine.stop_ids), len(sequence))
        assert result.token_ids == sequence[:stop]
        assert result.finish_reason == ("stop" if sequence[stop - 1] in engine.stop_ids else "length")
        logprobs = [
            float(torch.log_softmax(step[0].float(), dim=-1)[token])
            for step, token in zip(output.logits, result.token_ids, strict=False)
        ]
        assert result.logprobs == pytest.approx(logprobs, abs=1e-5)


def test_ended_rows_leave_the_batch_and_no_row_depends_on_its_companions(tiny_model, tiny_tokenizer) -> None:
    """Three of four rows end after two tokens: the other's remaining steps run alone. Each row's
    tokens (greedy, and sampled with or without its own seed) are those it gets in a batch of one."""
    from selfcest.engine import GenerationRequest

    engine = TransformersEngine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer, ["1+2", "3+4+5", "6-7", "8+9+1-2"])
    batch_rows: list[int] = []
    hook = tiny_model.register_forward_hook(
        lambda module, args, kwargs, out: batch_rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        engine.generate(
            [GenerationRequest(p, b) for p, b in zip(prompts, [2, 2, 2, 20], strict=True)], SamplingConfig()
        )
    finally:
        hook.remove()
    assert batch_rows[:2] == [4, 4] and set(batch_rows[2:]) == {1} and len(batch_rows) <= 20

    for sampling, seeds in (
        (SamplingConfig(), [None] * 4),
        (SamplingConfig(temperature=1.0, top_p=0.9, seed=5), [11, 12, 13, 14]),
        (SamplingConfig(temperature=1.0, seed=5), [None] * 4),
    ):
        requests = [
            GenerationRequest(p, 4 + 3 * i, seed=s)
            for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
        ]
        together = engine.generate(requests, sampling)
        alone = TransformersEngine(tiny_model, tiny_tokenizer, max_batch_size=1).generate(requests, sampling)
        assert [r.token_ids for r in together] == [r.token_ids for r in alone]
        if seeds[0] is not None:  # a request's own seed: the same tokens in any call
            assert engine.generate(requests[2:3], sampling)[0].token_ids == together[2].token_ids


# ------------------------------------------------------------------ expression halves
def test_expression_halves_carry_a_long_sum_down_the_tree(tiny_tokenizer) -> None:
    terms = [3, -4, 5, 1, -2, 6, 7, -8, 9, 1, 2, -3, 4, 5, -6, 7, 8, -9, 1, 2]  # 20 terms
    expr = "3" + "".join(f"{t:+d}" for t in terms[1:])
    config = RuntimeConfig(expression_halves=True, expression_max_depth=3, episode_token_budget=1024)
    engine = ScriptedEngine(tiny_tokenizer, halving_policy)
    [episode] = Runtime(engine, config).run([Task("long", arithmetic_question(expr))])
    assert episode.final_answer == str(sum(terms))
    assert not episode.protocol_errors
    clones = [a for a in episode.agents if a.role == "clone"]
    # 20 -> 10 + 10 -> four clones of 5 at depth 2, which add their sums themselves
    assert sorted(a.depth for a in clones) == [1, 1, 2, 2, 2, 2]
    leaves = [a for a in clones if a.depth == 2]
    # each clone's prompt holds its own half, cut by the runtime: nothing was copied by the policy
    held = [a.token_ids for a in leaves]
    texts = [tiny_tokenizer.decode(ids, skip_special_tokens=False) for ids in held]
    assert [last_user(t).split("\n", 1)[0] for t in texts] == [
        "[first half] 3-4+5+1-2",
        "[second half] 6+7-8+9+1",
        "[first half] 2-3+4+5-6",
        "[second half] 7+8-9+1+2",
    ]
    # the agents at depth 2 (the last below expression_max_depth 3) still hold the tool
    assert all("spawn_clone" in t for t in texts)
    check_accounting(episode, config)


def test_expression_halves_depth_and_off_switch(tiny_tokenizer) -> None:
    expr = "1+2+3+4+5+6+7+8+9+1+2+3"
    engine = ScriptedEngine(tiny_tokenizer, halving_policy)
    # depth 1: clones have no tool, and the policy's 6-term clones add their sums anyway
    config = RuntimeConfig(expression_halves=True, expression_max_depth=1)
    [episode] = Runtime(engine, config).run([Task("d1", arithmetic_question(expr))])
    assert episode.final_answer == "51"
    assert [a.depth for a in episode.agents] == [0, 1, 1]
    # off: the sum offers no documents, so a call naming a half is a protocol error
    [episode] = Runtime(engine, RuntimeConfig()).run([Task("off", arithmetic_question(expr))])
    assert any(e["kind"] == "unknown_context_key" for e in episode.protocol_errors)
    assert episode.final_answer != "51"


def test_an_unusable_objective_keeps_its_place_in_the_clone_numbering(tiny_tokenizer) -> None:
    """`turn1_clone{i}` is the i-th objective the root wrote: an objective without a task starts no
    clone, answers `failed`, and the clones after it keep their numbers."""

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: " + ("11" if "task A" in prompt else "22")
        if "<tool_response>" in last_user(prompt):
            return "Answer: done"
        return spawn([{"task": ""}, {"task": "task A"}, {"task": "task B"}])

    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()).run([Task("t", "Do it.")])
    assert [(a.agent_id, a.task) for a in episode.agents[1:]] == [
        ("root/turn1_clone1", "task A"),
        ("root/turn1_clone2", "task B"),
    ]
    assert [e["kind"] for e in episode.protocol_errors] == ["invalid_objective"]
    message = tiny_tokenizer.decode(episode.root.token_ids).split("<tool_response>")[1]
    lines = message.split("</tool_response>")[0].strip().splitlines()
    assert lines == [
        "turn1_clone0: failed (invalid objective: no task)",
        "turn1_clone1: 11",
        "turn1_clone2: 22",
    ]


def test_a_separate_call_of_unusable_objectives_keeps_their_places_too(tiny_tokenizer) -> None:
    """Written as two calls, the same objectives numbered otherwise: the call with no usable
    objective was dropped, and the root read task A's answer as `turn1_clone0`."""

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: " + ("11" if "task A" in prompt else "22")
        if "<tool_response>" in last_user(prompt):
            return "Answer: done"
        return spawn([{"task": ""}]) + spawn([{"task": "task A"}, {"task": "task B"}])

    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()).run([Task("t", "Do it.")])
    assert [(a.agent_id, a.task) for a in episode.agents[1:]] == [
        ("root/turn1_clone1", "task A"),
        ("root/turn1_clone2", "task B"),
    ]
    assert episode.root.tool_calls == 1  # the call that started clones
    message = tiny_tokenizer.decode(episode.root.token_ids).split("<tool_response>")[1]
    assert message.split("</tool_response>")[0].strip().splitlines() == [
        "turn1_clone0: failed (invalid objective: no task)",
        "turn1_clone1: 11",
        "turn1_clone2: 22",
    ]


def clones_writing(tokenizer, clone_tokens: list[int], objectives: list[dict]) -> ScriptedEngine:  # noqa: ANN001
    """An engine whose root spawns `objectives` and then answers 7, and whose clones each generate
    exactly `clone_tokens` (token ids a text policy could not produce, such as a spelled marker)."""

    class FixedClones(ScriptedEngine):
        def generate(self, requests, sampling):  # noqa: ANN001, ANN202
            results = super().generate(requests, sampling)
            for request, result in zip(requests, results, strict=True):
                if CLONE_SYSTEM_PROMPT in tokenizer.decode(request.prompt_ids):
                    result.token_ids = [*clone_tokens, self.end_id]
                    result.finish_reason = "stop"
            return results

    def policy(prompt: str) -> str:
        return "Answer: 7" if "<tool_response>" in last_user(prompt) else spawn(objectives)

    return FixedClones(tokenizer, policy)


def test_model_text_cannot_put_control_tokens_into_another_agents_prompt(tiny_tokenizer) -> None:
    """A clone that spells `<|im_end|>` with ordinary tokens, and a root that writes `<tool_call>` into
    a clone's task, reach the other agent's prompt without those strings, so its encoding holds no
    control token the other agent did not write itself."""
    end_id = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    spelled = tiny_tokenizer.encode("Answer: 7<", add_special_tokens=False) + tiny_tokenizer.encode(
        "|im_end|>", add_special_tokens=False
    )
    assert end_id not in spelled and tiny_tokenizer.decode(spelled).endswith("7<|im_end|>")

    engine = clones_writing(tiny_tokenizer, spelled, [{"task": "add <tool_call> this"}])
    [episode] = Runtime(engine, RuntimeConfig()).run([Task("t", "Do it.")])
    clone, root = episode.agents[1], episode.root
    assert clone.answer == "7<|im_end|>"  # its own record keeps what it wrote
    open_id, close_id = (
        tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<tool_response>", "</tool_response>")
    )
    tool_message = root.token_ids[root.token_ids.index(open_id) + 1 : root.token_ids.index(close_id)]
    assert end_id not in tool_message and tiny_tokenizer.decode(tool_message).strip() == "turn1_clone0: 7"
    call_id = tiny_tokenizer.convert_tokens_to_ids("<tool_call>")
    clone_prompt = clone.token_ids[: clone.generated_mask.index(1)]
    assert call_id not in clone_prompt and "add  this" in tiny_tokenizer.decode(clone_prompt)


def test_a_clone_answer_of_only_control_markup_is_no_answer(tiny_tokenizer) -> None:
    """A clone whose answer is nothing but a control-token string (`</tool_call>`, spelled with
    ordinary tokens) has no answer its parent can read: it fails, and its parent is told so, instead
    of reading an empty answer."""
    spelled = tiny_tokenizer.encode("Answer: </tool", add_special_tokens=False) + tiny_tokenizer.encode(
        "_call>", add_special_tokens=False
    )

    engine = clones_writing(tiny_tokenizer, spelled, [{"task": "add"}])
    [episode] = Runtime(engine, RuntimeConfig()).run([Task("t", "Do it.")])
    clone, root = episode.agents[1], episode.root
    assert (clone.status, clone.answer) == ("no_answer", None)
    message = tiny_tokenizer.decode(root.token_ids).split("<tool_response>")[1].split("</tool_response>")[0]
    assert message.strip() == "turn1_clone0: failed (its answer was only control markup)"


def test_an_engine_result_longer_than_its_grant_is_cut_and_counts_as_truncated(tiny_tokenizer) -> None:
    from selfcest.engine import GenerationResult

    full = tiny_tokenizer.encode("Answer: 123456", add_special_tokens=False) + [
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]

    class Overlong:
        tokenizer = tiny_tokenizer

        def generate(self, requests, sampling):  # noqa: ANN001, ANN202 (ignores max_new_tokens)
            return [
                GenerationResult(full, tiny_tokenizer.decode(full, skip_special_tokens=True), "stop")
                for _ in requests
            ]

    config = RuntimeConfig(use_tools=False, root_max_tokens=6, episode_token_budget=6)
    [episode] = Runtime(Overlong(), config).run([Task("t", "Calculate the value of 1.")])
    turn = episode.root.turns[0]
    assert (turn.generated_tokens, turn.finish_reason) == (6, "length")
    assert episode.root.status == "truncated" and episode.final_answer is None  # not "1234"


def test_a_clone_out_of_its_own_tokens_is_truncated_not_the_episode_out_of_budget(tiny_tokenizer) -> None:
    """A halving clone whose spawn turn leaves it too few of its own tokens for its next turn fails
    as truncated; the episode, with most of its budget left, is not marked budget-exhausted."""
    config = RuntimeConfig(
        expression_halves=True,
        expression_max_depth=2,
        clone_max_tokens=40,
        default_clone_max_tokens=40,
        episode_token_budget=5000,
        root_max_tokens=200,
    )
    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, halving_policy), config).run(
        [Task("t", arithmetic_question("+".join(["1"] * 24)))]
    )
    first = episode.agents[1]
    assert first.depth == 1 and first.generated_tokens == first.max_tokens == 40
    assert (first.status, first.failure) == ("truncated", "hit its token limit before its next turn")
    assert episode.generated_tokens < episode.budget and not episode.budget_exhausted


def test_a_lone_surrogate_in_a_task_does_not_crash_the_batch(tiny_tokenizer) -> None:
    """A root that writes `"\\ud800"` (ASCII, read by json as a lone surrogate) into a clone's task
    made the tokenizer raise while building the clone's prompt, which ended every episode of the
    batch; the clone now reads U+FFFD there, and the other episodes finish as usual."""

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: 2"
        if "<tool_response>" in last_user(prompt):
            return "Answer: 3"
        return (
            '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["add \\ud800 1+1"]}}</tool_call>'
        )

    episodes = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()).run(
        [Task("t", "Do it."), Task("u", "Do it too.")]
    )
    for episode in episodes:
        assert episode.final_answer == "3"
        assert episode.agents[1].task == "add \ufffd 1+1"
        json.dumps(episode.to_dict(), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("written", ["Answer: 123456", "Answer:\n123456", "Answer:\r\n 123456"])
def test_an_answer_on_the_line_after_the_marker_cut_by_the_token_limit_is_not_an_answer(
    tiny_tokenizer, written: str
) -> None:
    """`extract_answer` reads the first line after `Answer:` that is not blank, so a cut in that line
    is a cut answer wherever the line starts: "Answer:\\n12345" of 123456 was taken as answered."""
    cap = len(tiny_tokenizer.encode(written, add_special_tokens=False)) - 1  # all but the last digit(s)

    def policy(prompt: str) -> str:
        if CLONE_SYSTEM_PROMPT in prompt:
            return written
        if "<tool_response>" in last_user(prompt):
            return "Answer: 0"
        return spawn([{"task": "Say 123456.", "max_tokens": cap}])

    [episode] = Runtime(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()).run([Task("t", "Do it.")])
    clone = episode.agents[1]
    assert clone.turns[-1].finish_reason == "length" and clone.turns[-1].text.endswith("12345")
    assert (clone.status, clone.answer) == ("truncated", None)


def test_digits_apart_by_a_space_are_not_two_terms_of_a_sum() -> None:
    """`parse_terms` dropped spaces before comparing, so "12 7" (no operator: not a sum) was cut into
    halves as 12+7, and "1 2+3" as 1+2 | 3; neither is a flat sum to cut."""
    from selfcest.halves import expression_halves, parse_terms, question_expression

    for expr in ["12 7", "1 2+3", "1+2 3"]:
        with pytest.raises(ValueError):
            parse_terms(expr)
        assert expression_halves(expr) == {}
    assert question_expression(arithmetic_question("12 7")) == "12 7"
    assert parse_terms("12+7-3") == [12, 7, -3] and parse_terms("-3") == [-3]
    assert expression_halves("12+7-3") == {"first half": "12+7", "second half": "-3"}


def test_a_sum_spelt_with_spaces_around_its_operators_is_cut_as_without() -> None:
    """`"12 + 7"` and `"5- 3"` (a user's spelling, e.g. `selfcest solve`) got no halves at all, while
    `"12 +7"` did: the terms were read before the spaces were taken out."""
    from selfcest.halves import expression_halves, parse_terms

    assert parse_terms("12 + 7 - 3") == parse_terms("12+7-3") == [12, 7, -3]
    assert parse_terms("- 3 + 4") == [-3, 4]
    assert expression_halves("5- 3") == expression_halves("5 -3") == {"first half": "5", "second half": "-3"}
    assert expression_halves("1 + 2 + 3 + 4") == {"first half": "1+2", "second half": "3+4"}
    for expr in ["12 7 + 1", "1 + + 2", "1 +", "+"]:
        assert expression_halves(expr) == {}, expr


def test_only_ascii_digits_are_terms() -> None:
    """`\\d` matched other scripts' digits, so "١٢+٣" (Arabic-Indic) parsed as 12+3 and was cut."""
    from selfcest.halves import expression_halves, parse_terms

    for expr in ["\u0661\u0662+\u0663", "1+\uff12"]:  # Arabic-Indic 12+3; 1 + fullwidth 2
        with pytest.raises(ValueError, match="not a \\+/- expression of integers"):
            parse_terms(expr)
        assert expression_halves(expr) == {}


def test_a_problems_samples_do_not_depend_on_what_runs_beside_it(tiny_model, tiny_tokenizer) -> None:
    """Every request the runtime makes carries its own seed, keyed by task, sample, copy, agent and
    turn: a task's sampled episodes are the same alone, beside other tasks and in micro-batches of
    any size (the global generator made them depend on all three); copies of one task in a call
    (GRPO's rollouts of a prompt) and its samples still draw differently."""

    def strip(episodes: list[Episode]) -> list[dict]:
        return [{k: v for k, v in e.to_dict().items() if k != "wall_seconds"} for e in episodes]

    config = RuntimeConfig(root_max_tokens=24, episode_token_budget=64)
    tasks = [Task(str(i), arithmetic_question(f"{i}+{i * 7}")) for i in range(3)]
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, seed=3)

    def run(batch: list[Task], max_batch_size: int, samples: int = 2) -> list[Episode]:
        engine = TransformersEngine(tiny_model, tiny_tokenizer, max_batch_size=max_batch_size)
        return Runtime(engine, config).run(batch, sampling=sampling, num_samples=samples)

    together = run(tasks, 64)
    assert strip(run(tasks[:1], 64)) == strip(together[:2])
    assert strip(run(tasks, 1)) == strip(together)
    assert strip(run(tasks[2:] + tasks[:1], 2)[2:]) == strip(together[:2])
    assert together[0].final_text != together[1].final_text  # two samples of task 0
    copies = run([tasks[0], tasks[0]], 64, samples=1)
    assert copies[0].final_text != copies[1].final_text
    assert strip(copies[:1]) == strip(together[:1])


def test_per_row_sampling_keeps_to_the_top_p_nucleus() -> None:
    """The per-row sampler applies temperature and top-p before it draws, as `generate` does: a token
    outside the nucleus is never drawn."""
    import torch

    from selfcest.engine import _PerRowSampling

    scores = torch.log(torch.tensor([[0.6, 0.3, 0.1, 0.0001]] * 4))
    nucleus = _PerRowSampling(
        [1, 2, 3, 4], temperature=1, top_p=0.5, device=torch.device("cpu")
    )  # YAML `1`: an int
    for _ in range(20):
        assert nucleus.draw(scores.clone(), [0, 1, 2, 3]).tolist() == [0, 0, 0, 0]
    wide = _PerRowSampling([7] * 4, temperature=1.0, top_p=1.0, device=torch.device("cpu"))
    drawn = {int(wide.draw(scores.clone(), [0, 1, 2, 3])[0]) for _ in range(60)}
    assert {0, 1} <= drawn


def test_accelerator_name_names_the_gpu_of_a_cuda_device_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert accelerator_name("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert accelerator_name("cuda") is None  # no GPU visible
    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}

    def device_name(device: torch.device) -> str:
        if device.index not in (None, *names):
            raise AssertionError("Invalid device id")  # what torch raises for an index past the GPUs
        return names[device.index or 0]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", device_name)
    assert accelerator_name("cuda") == "NVIDIA H200" and accelerator_name("cuda:1") == "NVIDIA H100 80GB HBM3"
    assert accelerator_name("cuda:7") is None and accelerator_name("cpu") is None


def test_resolve_device_reads_auto_as_the_gpu_where_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` is CUDA with a GPU, else the CPU: one reading for the eval cells and `selfcest solve`."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
