"""benchmarks/warmup_skills.py: where a wrong multi-hop QA episode first left the gold path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from selfcest.runtime import AgentRecord, Episode

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "warmup_skills.py"
spec = importlib.util.spec_from_file_location("warmup_skills", SCRIPT)
warmup_skills = importlib.util.module_from_spec(spec)
spec.loader.exec_module(warmup_skills)

# A real synthetic record's hops (data/qa/validation.jsonl, seed 42): Rizo -> Nori -> Tote.
HOPS = [
    {"answer": "Nori", "paragraph_key": "Rizo", "question": "Which company does Rizo work for?"},
    {"answer": "Tote", "paragraph_key": "Nori", "question": "Who founded Nori?"},
]


def _agent(
    agent_id: str, role: str, spawn_turn: int | None, keys: list[str], answer: str | None
) -> AgentRecord:
    return AgentRecord(
        agent_id=agent_id,
        role=role,  # type: ignore[arg-type]
        depth=0 if role == "root" else 1,
        parent_id=None if role == "root" else "root",
        spawn_turn=spawn_turn,
        task="",
        context_keys=keys,
        requested_max_tokens=None,
        max_tokens=32,
        answer=answer,
    )


def _episode(first: tuple[list[str], str | None] | None, second: list[str] | None) -> Episode:
    agents = [_agent("root", "root", None, [], "Tote")]
    if first is not None:
        agents.append(_agent("root/turn1_clone0", "clone", 1, first[0], first[1]))
    if second is not None:
        agents.append(_agent("root/turn2_clone0", "clone", 2, second, "Tote"))
    return Episode(task_id="t", sample_index=0, mode="delegate", budget=128, agents=agents)


@pytest.mark.parametrize(
    ("first", "second", "stage"),
    [
        (None, None, "no_delegation"),
        ((["Nori"], "Tote"), ["Nori"], "root_first_key"),
        # The clone read the wrong name and the root copied it faithfully: the clone's fault.
        ((["Rizo"], "Vivi"), ["Vivi"], "hop1_clone_answer"),
        ((["Rizo"], "Rizo"), ["Rizo"], "hop1_clone_answer"),
        ((["Rizo"], None), None, "hop1_clone_answer"),
        # The clone was right (SQuAD-normalised) and the root did not hand its answer on.
        ((["Rizo"], "nori."), ["Rizo"], "root_second_key"),
        ((["Rizo"], "Nori"), None, "root_second_key"),
        ((["Rizo"], "Nori"), ["Nori"], "after_second_spawn"),
    ],
)
def test_failure_stage_names_the_first_step_off_the_gold_path(
    first: tuple[list[str], str | None] | None, second: list[str] | None, stage: str
) -> None:
    assert warmup_skills.qa_failure_stage(_episode(first, second), HOPS) == stage
    assert stage == "no_delegation" or stage in warmup_skills.QA_FAILURE_STAGES


def test_hop_keys_read_the_roots_own_first_spawn_as_the_failure_stages_do() -> None:
    """`hop_keys_copied` looked at the first clone only, so a root that handed hop 1's key to its
    second clone counted as "first key not copied" while `qa_failure_stage` passed it; and a clone's
    own clones (their `spawn_turn` is their parent's turn) counted as the root's first spawn."""
    agents = [
        _agent("root", "root", None, [], "wrong"),
        _agent("root/turn1_clone0", "clone", 1, ["Vivi"], "x"),  # a distractor listed first
        _agent("root/turn1_clone1", "clone", 1, ["Rizo"], "Nori"),
        _agent("root/turn2_clone0", "clone", 2, ["Nori"], "Tote"),
    ]
    episode = Episode(task_id="t", sample_index=0, mode="delegate", budget=128, agents=agents)
    assert warmup_skills.hop_keys_copied(episode, HOPS) == (True, True)
    assert warmup_skills.qa_failure_stage(episode, HOPS) == "after_second_spawn"
    grandchild = _agent("root/turn1_clone1/turn1_clone0", "clone", 1, ["Nori"], "Tote")
    grandchild.depth, grandchild.parent_id = 2, "root/turn1_clone1"
    first, later = warmup_skills.first_and_later_clones(
        Episode(task_id="t", sample_index=0, mode="delegate", budget=128, agents=[*agents, grandchild])
    )
    assert [a.agent_id for a in first] == ["root/turn1_clone0", "root/turn1_clone1"]
    assert [a.agent_id for a in later] == ["root/turn2_clone0"]
