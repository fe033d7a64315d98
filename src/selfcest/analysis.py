"""Did the policy learn *when* to delegate? Delegation rate and clones per problem by problem size.

Computed from the evaluation cells' per-problem records (`episodes.jsonl`), so it costs no extra
generation: `prompted` is the starting checkpoint with the tool (before RL), `selfcest` the same
model after GRPO.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_EXPRESSION = re.compile(r"Calculate the value of ([0-9+\-*() ]+)\.")


def problem_size(record: Mapping[str, Any]) -> int | None:
    """Arithmetic: number of terms in the expression; QA: number of hops (when known)."""
    if record.get("dataset") == "arithmetic":
        match = _EXPRESSION.search(str(record.get("question", "")))
        if not match:
            return None
        expr = match.group(1).replace(" ", "")
        return len(re.findall(r"(?<=[0-9)])[+\-*]", expr)) + 1
    hops = record.get("num_hops")
    return int(hops) if hops else None


def delegation_by_size(records: Iterable[Mapping[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (dataset, split, method, budget, size): n, delegation rate, clones, accuracy, tokens."""
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("method") not in methods:
            continue
        size = problem_size(record)
        if size is None:
            continue
        key = (record["dataset"], record["split"], record["method"], int(record["budget"]), size)
        groups[key].append(record)
    rows = []
    for (dataset, split, method, budget, size), items in sorted(groups.items()):
        n = len(items)
        rows.append(
            {
                "dataset": dataset,
                "split": split,
                "method": method,
                "budget": budget,
                "size": size,
                "n": n,
                "delegation_rate": round(sum(float(r.get("clones") or 0) > 0 for r in items) / n, 4),
                "clones": round(sum(float(r.get("clones") or 0) for r in items) / n, 4),
                "accuracy": round(sum(float(r.get("correct") or 0) for r in items) / n, 4),
                "gen_tokens": round(sum(float(r.get("generated_tokens") or 0) for r in items) / n, 2),
            }
        )
    return rows


# ---------------------------------------------------------------------------- where sums go wrong
# Why a parser of the agents' step lines and not a re-run: the sweep already holds every agent's text,
# and the runtime cut each half from its parent's sum, so every agent's own sum is known without
# running anything. Model text is parsed, never evaluated.
# Numbers of at most 40 digits: model text is untrusted, and int() refuses over 4,300 digits.
_STEP = re.compile(r"^(-?\d{1,40})([+-])(\d{1,40})=(-?\d{1,40})$")
_INTEGER = re.compile(r"^[+-]?\d{1,40}$")  # "+8" too, which the scorer (and int()) read as 8
# A step both of whose operands have two or more digits: the additions a tree's combining turns need
# on long sums (two halves' sums) and that single-digit training sums seldom hold.
WIDE_OPERAND = 10

FAILURE_KINDS: tuple[str, ...] = (
    "cut_off",
    "protocol",
    "part_terms",
    "part_addition",
    "combine_readback",
    "combine_addition",
    "answer_off_steps",
    "other",
)
"""Where a wrong arithmetic answer first went wrong, walking down the tree from the root to the first
agent whose own work was wrong (its clones, if it had any, all right):
- `cut_off`: that agent ran out of tokens (its cap, or the tree-wide budget);
- `protocol`: it gave no parseable answer, or its tool call failed;
- `part_terms`: it solved its sum (or part) alone and its steps left out or changed a term;
- `part_addition`: it solved alone, every term in place, and one addition was wrong;
- `combine_readback`: its clones' answers were right and its additions took other numbers than
  theirs, or went on past them (adding terms that no clone answered);
- `combine_addition`: it added its clones' right answers and got the sum wrong;
- `answer_off_steps`: every step right, and its `Answer:` is not their result (for `thinking`: its
  `Check:` pass, which repeats the steps, ended elsewhere);
- `other`: anything else (a clone handed something other than a half, clones whose halves do not
  make up the agent's sum, or answers that are not integers)."""


def _agent_terms(record: Mapping[str, Any], agents: Sequence[Mapping[str, Any]]) -> list[list[int] | None]:
    """Each agent's own terms: the root's are the question's, read as the runtime reads them
    (`selfcest.halves.question_expression`); a clone's are those of the half its one key names, cut
    from its parent's by `expression_halves` (as the runtime cut it). None where not known."""
    from selfcest.halves import expression_halves, parse_terms, question_expression

    by_id: dict[str, str | None] = {}
    terms: list[list[int] | None] = []
    for agent in agents:
        parent = agent.get("parent_id")
        if parent is None:
            expr = question_expression(str(record.get("question", "")))
        else:
            keys = list(agent.get("context_keys") or [])
            parent_expr = by_id.get(str(parent))
            expr = expression_halves(parent_expr).get(keys[0]) if parent_expr and len(keys) == 1 else None
        by_id[str(agent.get("agent_id"))] = expr
        terms.append(parse_terms(expr) if expr is not None else None)
    return terms


def _as_int(text: object) -> int | None:
    value = str(text).strip() if text is not None else ""
    return int(value) if _INTEGER.match(value) else None


def step_lines(text: str) -> list[tuple[int, int, int]]:
    """`(a, signed b, c)` per `a+b=c` / `a-b=c` line, up to a thinking mode's `Check:` (whose lines
    repeat the ones before it)."""
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Check:"):
            break
        match = _STEP.match(line)
        if match:
            b = int(match.group(3))
            steps.append((int(match.group(1)), b if match.group(2) == "+" else -b, int(match.group(4))))
    return steps


def _chain_failure(steps: Sequence[tuple[int, int, int]], terms: Sequence[int]) -> str:
    """The first way `steps` leave the running sum of `terms`: a term changed, left out, added or not
    reached (`terms`), or an addition wrong (`addition`); `answer` when the chain is whole and right."""
    if not terms:
        return "terms"
    total = terms[0]
    for index, term in enumerate(terms[1:]):
        if index >= len(steps):
            return "terms"
        a, b, c = steps[index]
        if a != total or b != term:
            return "terms"
        if c != a + b:
            return "addition"
        total = c
    return "terms" if len(steps) >= len(terms) else "answer"


def _failure_kind(
    index: int,
    agents: Sequence[Mapping[str, Any]],
    terms: Sequence[list[int] | None],
    steps: Sequence[list[tuple[int, int, int]]],
    right: Sequence[bool],
    depth: int = 0,
) -> str:
    """The kind (`FAILURE_KINDS`) of the first wrong agent's own work below agent `index`, which is
    wrong; `terms` and `steps` are each agent's own terms and step lines."""
    agent = agents[index]
    children = [c for turn in agent.get("children") or [] for c in turn if 0 <= c < len(agents)]
    wrong = [c for c in children if not right[c]]
    if wrong and depth < len(agents):  # bounded: a tree has no more levels than agents
        return _failure_kind(wrong[0], agents, terms, steps, right, depth + 1)
    status = agent.get("status")
    if status in ("budget_exhausted", "truncated"):
        return "cut_off"
    if status != "ok":
        return "protocol"
    own_terms = terms[index]
    if own_terms is None:
        return "other"
    if not children:
        kind = _chain_failure(steps[index], own_terms)
        return "answer_off_steps" if kind == "answer" else f"part_{kind}"
    answers = [_as_int(agents[c].get("answer")) for c in children]
    if any(a is None for a in answers) or sum(answers) != sum(own_terms):  # type: ignore[arg-type]
        # Right answers that do not make up its sum (a half handed twice, one never handed): no
        # addition of them could be right, so it is no combining slip.
        return "other"
    kind = _chain_failure(steps[index], answers)  # type: ignore[arg-type]
    return {"terms": "combine_readback", "addition": "combine_addition", "answer": "answer_off_steps"}[kind]


def _single_episode_agents(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The agents of a single-episode arithmetic record; none for any other record (sc@k's votes
    have several episodes)."""
    episodes = record.get("episodes") or []
    if record.get("dataset") != "arithmetic" or len(episodes) != 1:
        return []
    return episodes[0].get("agents") or []


def arithmetic_audit(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """One arithmetic record's audit: `failure` (a `FAILURE_KINDS` entry; None when right), `alone`
    (the root spawned no clone) and its agents' step lines checked, `part_steps` (agents solving
    alone) and `combine_steps` (agents adding their clones' answers) as `[right, all]`,
    `wide_combine_steps` those of the latter whose operands both have two or more digits. None for
    a record that is not one single-episode arithmetic problem (sc@k's votes have several)."""
    agents = _single_episode_agents(record)
    if not agents:
        return None
    terms = _agent_terms(record, agents)
    steps = [step_lines(str(turns[-1].get("text", ""))) if (turns := a.get("turns")) else [] for a in agents]
    right = [
        own is not None and _as_int(agent.get("answer")) == sum(own)
        for agent, own in zip(agents, terms, strict=True)
    ]
    counts = {"part_steps": [0, 0], "combine_steps": [0, 0], "wide_combine_steps": [0, 0]}
    for agent, agent_steps in zip(agents, steps, strict=True):
        kind = "combine_steps" if agent.get("children") else "part_steps"
        for a, b, c in agent_steps:
            ok = int(c == a + b)
            counts[kind][0] += ok
            counts[kind][1] += 1
            if kind == "combine_steps" and abs(a) >= WIDE_OPERAND and abs(b) >= WIDE_OPERAND:
                counts["wide_combine_steps"][0] += ok
                counts["wide_combine_steps"][1] += 1
    failure = None if float(record.get("correct") or 0) > 0 else _failure_kind(0, agents, terms, steps, right)
    return {"failure": failure, "alone": not agents[0].get("children"), **counts}


def half_leaf_results(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Clones that solved a half alone (no clones of their own), per (split, method, budget, key, lead):
    `key` the half they were handed (`first half` / `second half`), `lead` the sign of its first term
    (`-`: a subtracted term), `n` how many and `right` how many answered their half's sum. The warm-up
    teacher's halves of training sums never start a `first half` with a subtracted term
    (`benchmarks/half_leads.py`), where the halves of a longer sum's second half do."""
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        agents = _single_episode_agents(record)
        for agent, own in zip(agents, _agent_terms(record, agents), strict=True):
            keys = list(agent.get("context_keys") or [])
            if own is None or agent.get("parent_id") is None or agent.get("children") or len(keys) != 1:
                continue
            group = (
                record["split"],
                record["method"],
                int(record["budget"]),
                keys[0],
                "-" if own[0] < 0 else "+",
            )
            counts[group][0] += 1
            counts[group][1] += _as_int(agent.get("answer")) == sum(own)
    return [
        {"split": split, "method": method, "budget": budget, "key": key, "lead": lead, "n": n, "right": right}
        for (split, method, budget, key, lead), (n, right) in sorted(counts.items())
    ]


def failure_anatomy(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per arithmetic (split, method, budget): n, wrong answers (`wrong_alone`: those whose root
    spawned no clone) by where they first went wrong (`FAILURE_KINDS`), and the share of right step
    lines in parts solved alone, in combining turns, and in combining turns adding two numbers of two
    or more digits (`*_steps`: how many lines)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        audit = arithmetic_audit(record)
        if audit is not None:
            groups[(record["split"], record["method"], int(record["budget"]))].append(audit)
    rows = []
    for (split, method, budget), audits in sorted(groups.items()):
        row: dict[str, Any] = {"split": split, "method": method, "budget": budget, "n": len(audits)}
        row["wrong"] = sum(a["failure"] is not None for a in audits)
        row["wrong_alone"] = sum(a["failure"] is not None and a["alone"] for a in audits)
        for kind in FAILURE_KINDS:
            row[kind] = sum(a["failure"] == kind for a in audits)
        for kind in ("part_steps", "combine_steps", "wide_combine_steps"):
            right = sum(a[kind][0] for a in audits)
            total = sum(a[kind][1] for a in audits)
            row[kind] = total
            row[f"{kind}_right"] = round(right / total, 4) if total else None
        rows.append(row)
    return rows


_FAILURE_LABELS = {
    "cut_off": "cut off",
    "protocol": "protocol",
    "part_terms": "alone: terms",
    "part_addition": "alone: addition",
    "combine_readback": "combining: read-back",
    "combine_addition": "combining: addition",
    "answer_off_steps": "answer off its steps",
    "other": "other",
}


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def failure_anatomy_markdown(
    rows: Sequence[Mapping[str, Any]], reference_budget: int | None, method_order: Sequence[str] = ()
) -> str:
    """The summary's section on `failure_anatomy` rows at the arithmetic reference budget: per split a
    table of each method's wrong answers by where they first went wrong and its step lines' accuracy,
    and the most common place per method; methods in `method_order` (others after them, by name).
    Empty when no row is at that budget."""
    rank = {method: i for i, method in enumerate(method_order)}
    at_reference = sorted(
        (r for r in rows if r["budget"] == reference_budget),
        key=lambda r: (rank.get(r["method"], len(rank)), r["method"]),
    )
    if not at_reference:
        return ""
    lines = [
        "## Where arithmetic answers go wrong",
        "",
        f"At budget {reference_budget}, from the sweep's own traces (`reports/arithmetic_failures.csv` has every "
        "budget; `selfcest.analysis.failure_anatomy`). Each wrong answer is placed at the first agent, "
        "from the root down, whose own work was wrong while its clones' answers (if it had clones) were "
        "right: it was cut off, broke the protocol, solved its sum alone and left out or changed a "
        "term (`alone: terms`) or added wrong (`alone: addition`), added other numbers than its "
        "clones' answers or went on past them (`combining: read-back`) or added them wrong (`combining: addition`), or "
        "answered other than its steps' result (`answer off its steps`; `thinking`: its check pass). `wrong alone`: wrong answers whose "
        "root spawned no clone. The last three columns are the share of right `a+b=c` lines: by agents "
        "solving alone, by agents adding their clones' answers, and of the latter those adding two "
        "numbers of two or more digits. sc@k's votes are left out.",
        "",
    ]
    for split in sorted({r["split"] for r in at_reference}):
        split_rows = [r for r in at_reference if r["split"] == split]
        header = ["method", "n", "wrong", "wrong alone", *_FAILURE_LABELS.values()]
        header += ["alone steps right", "combining steps right", "both >= 10"]
        lines += [f"### `arithmetic/{split}`", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        notes = []
        for row in split_rows:
            cells = [f"`{row['method']}`", str(row["n"]), str(row["wrong"]), str(row["wrong_alone"])]
            cells += [str(row[kind]) for kind in _FAILURE_LABELS]
            cells += [
                f"{_share(row['part_steps_right'])} ({row['part_steps']})",
                f"{_share(row['combine_steps_right'])} ({row['combine_steps']})",
                f"{_share(row['wide_combine_steps_right'])} ({row['wide_combine_steps']})",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            if row["wrong"]:
                kind = max(_FAILURE_LABELS, key=lambda k: row[k])
                notes.append(f"`{row['method']}` {_FAILURE_LABELS[kind]} ({row[kind]} of {row['wrong']})")
        lines.append("")
        if notes:
            lines += ["Most common first failure: " + "; ".join(notes) + ".", ""]
    return "\n".join(lines)
