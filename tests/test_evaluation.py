"""Budget-sweep evaluation: metrics, voting, methods through the runtime, and the eval stage end to end."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from benchmark_paths import BENCHMARKS as BENCH
from expectations import REQUIRED_SWEEP_COLUMNS

from selfcest.data.arithmetic import build_arithmetic_splits, evaluate_expression
from selfcest.data.qa import load_2wiki
from selfcest.evaluation import (
    BM25Ranker,
    Evaluator,
    MethodSpec,
    Problem,
    ProblemResult,
    answer_key,
    bootstrap_ci,
    episode_answer_text,
    evaluate_cell,
    load_problems,
    majority_vote,
    math_vote_keys,
    problem_from_record,
    runtime_config_from_params,
    score_answer,
    select_indices,
    summarize,
    vote_keys,
)
from selfcest.prompts import CLONE_SYSTEM_PROMPT, THINKING_SYSTEM_PROMPT
from selfcest.reports import method_applies
from selfcest.runtime import AgentRecord, Episode, RuntimeConfig
from selfcest.scripted import ScriptedEngine

REPO = Path(__file__).resolve().parents[1]
WIKI = BENCH / "2wikimultihopqa" / "2wikimultihopqa_dev_hipporag_first10.json"
MATH_HARD = BENCH / "math" / "math_hard_level5_test.jsonl"
AIME24 = BENCH / "aime" / "aime24_test.jsonl"


# --------------------------------------------------------------------------- real records
def arithmetic_records(count: int = 6) -> list[dict[str, Any]]:
    """Real records of the project's generator (its tiny profile, small tiers)."""
    params = {
        "seed": 5,
        "test_fraction": 0.5,
        "profile": "tiny",
        "profiles": {
            "tiny": {
                "generator": {
                    "operator_weights": {"+": 4, "-": 3, "*": 0},
                    "operand_digits": [1, 2],
                    "paren_local_prob": 0.0,
                    "paren_max_pairs": 0,
                    "paren_wide_prob": 0.0,
                },
                "tiers": {"easy": {"num_operators": [2, 4], "count": 2 * count}},
                "ood": None,
            }
        },
    }
    return build_arithmetic_splits(params)["test"][:count]


def wiki_records(count: int = 4) -> list[dict[str, Any]]:
    return load_2wiki(str(WIKI)).records[:count]


# --------------------------------------------------------------------------- metrics
def test_bootstrap_ci_known_inputs() -> None:
    assert bootstrap_ci([1.0] * 20, seed=1) == (1.0, 1.0)
    assert bootstrap_ci([0.0] * 20, seed=1) == (0.0, 0.0)
    assert bootstrap_ci([0.25], seed=1) == (0.25, 0.25)
    low, high = bootstrap_ci([], seed=1)
    assert math.isnan(low) and math.isnan(high)
    values = [0.0, 1.0] * 50  # mean 0.5, standard error 0.05: a 95% interval of about +-0.1
    low, high = bootstrap_ci(values, resamples=2000, seed=3)
    assert 0.38 < low < 0.45 and 0.55 < high < 0.62
    assert bootstrap_ci(values, resamples=2000, seed=3) == (low, high)  # seeded
    assert bootstrap_ci(values, resamples=2000, seed=4) != (low, high)
    assert bootstrap_ci(values, resamples=0) == (0.5, 0.5)


def _result(
    correct: float,
    gen: float,
    crit: float,
    f1: float | None = None,
    clones: float = 0.0,
    protocol_errors: float = 0.0,
) -> ProblemResult:
    return ProblemResult("p", None, correct, f1, gen, gen + 10, crit, 0.5, clones, protocol_errors, [])


def test_summarize_means_and_interval() -> None:
    results = [
        _result(1.0, 10, 5, clones=2, protocol_errors=1.0),
        _result(0.0, 30, 15),
        _result(1.0, 20, 10, clones=1),
        _result(1.0, 20, 10),
    ]
    row = summarize(results, seconds=2.0, resamples=500, seed=0)
    assert row["n"] == 4
    assert row["accuracy"] == 0.75
    assert row["gen_tokens"] == 20 and row["total_tokens"] == 30 and row["critical_tokens"] == 10
    assert row["seconds"] == 0.5 and row["clones"] == 0.75 and row["protocol_error_rate"] == 0.25
    # the interval is the bootstrap of the right/wrong values, with the cell's resamples and seed
    assert (row["ci_low"], row["ci_high"]) == bootstrap_ci([1.0, 0.0, 1.0, 1.0], resamples=500, seed=0)
    assert 0.0 <= row["ci_low"] < 0.75 < row["ci_high"] <= 1.0
    assert "f1" not in row
    f1 = [1.0, 0.5, 0.0, 1.0, 0.6, 0.9, 0.0, 0.2]
    qa = summarize(
        [_result(float(value == 1.0), 1, 1, f1=value) for value in f1], seconds=1.0, resamples=100, seed=0
    )
    assert qa["f1"] == pytest.approx(sum(f1) / len(f1))
    assert (qa["f1_ci_low"], qa["f1_ci_high"]) == bootstrap_ci(f1, resamples=100, seed=0)
    assert (qa["f1_ci_low"], qa["f1_ci_high"]) != (qa["ci_low"], qa["ci_high"])  # F1's, not EM's


def test_majority_vote() -> None:
    assert majority_vote([None, 3, 5, 3]) == 1
    assert majority_vote([5, 3, 3, 5]) == 0  # tie: the answer seen first wins
    assert majority_vote([None, 7, 2, 2, 7, 2]) == 2
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_answer_keys_group_equivalent_answers() -> None:
    assert answer_key("arithmetic", "the total is 42") == answer_key("arithmetic", "42") == 42
    assert answer_key("arithmetic", "no idea") is None
    assert answer_key("qa", "The Eiffel Tower.") == answer_key("qa", "eiffel tower")
    assert answer_key("qa", None) is None and answer_key("qa", "the") is None
    assert answer_key("math", None, r"so \boxed{ \frac{1}{2} }") == answer_key("math", r"\frac{1}{2}")
    assert answer_key("math", "033") == answer_key("math", "33")
    # str.isdigit() accepts superscripts that int() rejects: a key, not a crash of the whole unit
    assert answer_key("math", None, r"\boxed{4²}") == "4²"
    # int() refuses over 4,300 digits; a box may hold 20,000 characters
    assert answer_key("math", None, r"\boxed{00" + "1" * 5000 + "}") == "1" * 5000
    # \left and \right are sizing noise, but not the start of an arrow: opposite answers stay apart
    assert answer_key("math", None, r"\boxed{A \rightarrow B}") != answer_key(
        "math", None, r"\boxed{A \leftarrow B}"
    )
    assert answer_key("math", None, r"\boxed{\left( 1, 2 \right)}") == "(1,2)"


def math_root_episode(text: str, sample_index: int = 0, status: str = "no_answer") -> Episode:
    """A monolithic math episode whose root ended its turn with `text` (no `Answer:` marker: `no_answer`)."""
    root = AgentRecord("root", "root", 0, None, None, "q", [], None, 64)
    root.status = status  # type: ignore[assignment]
    return Episode("p", sample_index, "monolithic", 64, [root], final_text=text)


def test_math_votes_count_equivalent_spellings_as_one_answer() -> None:
    """Three samples say 1/2 in three spellings, two say 3: 1/2 wins, as the scorer would count it."""
    texts = [
        r"\boxed{\dfrac{1}{2}}",
        r"\boxed{3}",
        r"\boxed{\frac{1}{2}}",
        r"\boxed{3}",
        r"\boxed{\tfrac12}",
        "no box",
    ]
    group = [math_root_episode(text, i) for i, text in enumerate(texts)]
    keys = vote_keys("math", group)
    assert keys[0] == keys[2] == keys[4] != keys[1] == keys[3] and keys[5] is None
    winner = majority_vote(keys)
    assert winner == 0
    assert score_answer(Problem("p", "math", "q", [r"\frac{1}{2}"]), None, texts[winner])[0] == 1.0
    # spellings alone (before merging) split the majority: 3 would have won
    assert majority_vote([answer_key("math", None, text) for text in texts]) == 1
    assert math_vote_keys(["0.5", r"\frac{1}{2}", None, "2"]) == ["0.5", "0.5", None, "2"]


def test_scoring_per_dataset() -> None:
    assert score_answer(Problem("a", "arithmetic", "q", ["-11"]), "-11") == (1.0, None)
    assert score_answer(Problem("a", "arithmetic", "q", ["-11"]), None) == (0.0, None)
    em, f1 = score_answer(Problem("q", "qa", "q", ["20 March 851", "851"]), "20 march 851")
    assert em == 1.0 and f1 == 1.0
    em, f1 = score_answer(Problem("q", "qa", "q", ["20 March 851"]), "March 851")
    assert em == 0.0 and 0.0 < f1 < 1.0
    assert score_answer(Problem("m", "math", "q", [r"\frac{1}{2}"]), None, r"thus \boxed{0.5}")[0] == 1.0


def test_select_indices_is_a_seeded_nested_subset() -> None:
    assert select_indices(5, None, 0) == [0, 1, 2, 3, 4]
    assert select_indices(5, 10, 0) == [0, 1, 2, 3, 4]
    small, large = select_indices(100, 10, 7), select_indices(100, 20, 7)
    assert small == sorted(small) and len(small) == 10 and set(small) <= set(large)
    assert select_indices(100, 10, 7) == small and select_indices(100, 10, 8) != small


def test_problems_from_every_source(tmp_path: Path) -> None:
    [arith] = arithmetic_records(1)
    problem = problem_from_record("arithmetic", arith)
    assert problem.question == f"Calculate the value of {arith['expr']}." and problem.golds == [
        arith["answer"]
    ]
    [wiki] = wiki_records(1)
    problem = problem_from_record("qa", wiki)
    assert (
        list(problem.documents) == [p["key"] for p in wiki["paragraphs"]]
        and problem.num_hops == wiki["num_hops"]
    )
    line = json.loads(MATH_HARD.read_text(encoding="utf-8").splitlines()[1])
    problem = problem_from_record("math", line)
    assert problem.golds == [r"-\frac{1}{8}"]
    problems = load_problems("math", AIME24, max_problems=3, seed=0)
    assert len(problems) == 3 and all(p.golds[0].isdigit() for p in problems)
    with pytest.raises(ValueError):
        problem_from_record("chess", {})


def test_method_specs_from_params() -> None:
    spec = MethodSpec.from_params("sc@4", {"mode": "monolithic", "samples": 4, "temperature": 0.7})
    assert spec.samples == 4 and spec.applies_to("arithmetic")
    with pytest.raises(ValueError, match=r"^method x: unknown key\(s\) \['sample'\]"):
        MethodSpec.from_params("x", {"mode": "monolithic", "sample": 4})  # typo: unknown setting
    with pytest.raises(ValueError, match=r"^eval\.models\.m\.x: unknown key\(s\) \['sample'\]"):
        MethodSpec.from_params("x", {"sample": 4}, section="eval.models.m.x")
    with pytest.raises(ValueError):
        MethodSpec.from_params("x", {"samples": 4})  # sampling needs a temperature
    # Sampling settings no engine takes are refused with the method's name, before any unit runs.
    for values, setting in (
        ({"samples": 4, "temperature": 0.7, "top_p": 0}, "top_p"),
        ({"samples": 4, "temperature": 0.7, "top_p": 1.5}, "top_p"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
    ):
        with pytest.raises(ValueError, match=rf"^method x: {setting} must be"):
            MethodSpec.from_params("x", values)
    rag = MethodSpec.from_params("agentic-rag", {"mode": "rag"})
    assert rag.applies_to("qa") and not rag.applies_to("arithmetic")
    for values in ({"mode": "rag"}, {"mode": "monolithic"}, {"mode": "delegate", "datasets": ["math"]}):
        for dataset in ("arithmetic", "qa", "math"):  # the report's copy of the rule agrees
            assert method_applies(values, dataset) == MethodSpec.from_params("m", values).applies_to(dataset)


def test_bm25_ranks_the_matching_paragraph_first() -> None:
    ranker = BM25Ranker(
        {"a": "Paris is the capital of France.", "b": "Zono was born in Lone.", "c": "Rivers flow."}
    )
    assert ranker.rank("Where was Zono born?")[0] == "b"
    assert ranker.rank("Where was Zono born?", exclude=["b"])[0] != "b"
    assert sorted(ranker.rank("qqqq zzzz")) == ["a", "b", "c"]  # no known word: every paragraph, in order
    assert BM25Ranker({}).rank("anything") == []


# --------------------------------------------------------------------------- methods through the runtime
def _last_user(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user\n", 1)[-1]


def _solve(expr: str) -> str:
    return f"Answer: {evaluate_expression(expr)}"


def arithmetic_policy(prompt: str) -> str:
    """Monolithic: solve. Root: two clones, each half of the terms, then add. Clone: solve."""
    user = _last_user(prompt)
    if CLONE_SYSTEM_PROMPT in prompt or "spawn_clone" not in prompt:
        expr = re.search(r"Calculate the value of (.+?)\.", user).group(1)
        prefix = "Check: ok.\n" if THINKING_SYSTEM_PROMPT in prompt else ""
        return prefix + _solve(expr)
    if "<tool_response>" in user:
        partials = re.findall(r"turn\d+_clone\d+: (-?\d+)", user)
        return f"Answer: {sum(int(v) for v in partials)}"
    expr = re.search(r"Calculate the value of (.+?)\.", user).group(1)
    terms = re.findall(r"[+-]?\d+", expr)
    half = len(terms) // 2
    parts = ["".join(terms[:half]), "".join(terms[half:])]
    objectives = [{"task": f"Calculate the value of {p.lstrip('+')}.", "max_tokens": 24} for p in parts]
    return (
        "<tool_call>\n"
        + json.dumps({"name": "spawn_clone", "arguments": {"objectives": objectives}})
        + "\n</tool_call>"
    )


def test_methods_on_real_arithmetic_records(tiny_tokenizer) -> None:
    problems = [problem_from_record("arithmetic", r) for r in arithmetic_records(5)]
    engine = ScriptedEngine(tiny_tokenizer, arithmetic_policy)
    evaluator = Evaluator(engine, RuntimeConfig(root_max_tokens=96, clone_max_tokens=48), seed=0)
    base = MethodSpec("base")
    thinking = MethodSpec("thinking", system_prompt="thinking")
    sc = MethodSpec("sc@4", samples=4, temperature=0.7)
    delegate = MethodSpec("selfcest", mode="delegate")
    budget = 400
    base_results, seconds = evaluator.run(base, problems, budget)
    assert seconds > 0 and all(r.correct == 1.0 for r in base_results)
    assert all(r.generated_tokens == r.critical_path_tokens <= budget for r in base_results)
    think_results, _ = evaluator.run(thinking, problems, budget)
    assert all(r.correct == 1.0 for r in think_results)
    assert all(
        t.generated_tokens > b.generated_tokens for t, b in zip(think_results, base_results, strict=True)
    )
    sc_results, _ = evaluator.run(sc, problems, budget)
    for r in sc_results:
        assert r.correct == 1.0 and len(r.episodes) == 4 and r.extra["winner"] == 0
        assert (
            r.generated_tokens == sum(e.generated_tokens for e in r.episodes) <= budget
        )  # summed, within budget
        assert r.critical_path_tokens == max(e.critical_path_tokens for e in r.episodes)  # parallel samples
        assert all(e.budget == budget // 4 for e in r.episodes)  # the tree-wide budget is shared
    del_results, _ = evaluator.run(delegate, problems, budget)
    for r in del_results:
        assert r.correct == 1.0 and r.clones == 2
        assert r.critical_path_tokens < r.generated_tokens <= budget
    # A budget too small for anything: nothing overruns, nothing is right, nothing crashes.
    for spec in (base, sc, delegate):
        tight, _ = evaluator.run(spec, problems, 3)
        assert all(r.generated_tokens <= 3 and r.correct == 0.0 for r in tight)
    tiny, _ = evaluator.run(sc, problems, 3)  # 3 // 4 = 0 tokens per sample: not even started
    assert all(r.generated_tokens == 0 and r.extra.get("skipped") for r in tiny)


def test_math_reads_only_an_answer_the_root_finished(tiny_tokenizer) -> None:
    """On math as on arithmetic, an answer line cut by the token limit ("Answer: 20" of 204) is no
    answer, nor is a box inside a tool call; an answer with a closing full stop or bold is one."""
    reply = "So the total is Answer: 204"
    ids = tiny_tokenizer.encode(reply, add_special_tokens=False)
    cut = next(
        n for n in range(1, len(ids)) if tiny_tokenizer.decode(ids[:n]).rstrip().endswith("Answer: 20")
    )
    for dataset, question in (("math", "What is 10+10?"), ("arithmetic", "Calculate the value of 10+10.")):
        evaluator = Evaluator(ScriptedEngine(tiny_tokenizer, lambda prompt: reply), RuntimeConfig(), seed=0)
        [result], _ = evaluator.run(MethodSpec("base"), [Problem("p", dataset, question, ["20"])], cut)
        assert result.episodes[0].root.status == "truncated" and result.correct == 0.0, dataset
    boxed_call = math_root_episode(
        '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"task": "is \\boxed{7} right"}]}}\n</tool_call>'
    )
    assert score_answer(Problem("p", "math", "q", ["7"]), None, episode_answer_text(boxed_call))[0] == 0.0
    for reply in ("Answer: 204.", "Answer: **204**", "Answer: $204$.", "\\boxed{} so Answer: 204."):
        evaluator = Evaluator(
            ScriptedEngine(tiny_tokenizer, lambda prompt, r=reply: r), RuntimeConfig(), seed=0
        )
        [result], _ = evaluator.run(MethodSpec("base"), [Problem("p", "math", "What is 200+4?", ["204"])], 64)
        assert result.correct == 1.0, reply
    assert answer_key("math", "204.") == answer_key("math", "204") == "204"


def test_math_scoring_finds_the_roots_last_box_once(tiny_tokenizer, monkeypatch) -> None:
    """Scoring a math answer reads the root's last `\\boxed{}` once: `episode_answer_text` hands on the
    root's own text and the scorer finds the box (or the `Answer:` line) in it, not both of them."""
    import selfcest.evaluation
    import selfcest.scoring

    scanned: list[object] = []

    def counting(read: Any) -> Any:
        def counted(text: object, *args: object, **kwargs: object) -> str | None:
            scanned.append(text)
            return read(text, *args, **kwargs)

        return counted

    for module, name in (
        (selfcest.scoring, "last_boxed"),
        (selfcest.scoring, "_last_non_empty_box"),  # what `last_non_empty_boxed` reads with
        (selfcest.evaluation, "last_boxed"),
    ):
        monkeypatch.setattr(module, name, counting(getattr(module, name)))
    for reply in ("so \\boxed{204}.", "Answer: 204."):
        evaluator = Evaluator(
            ScriptedEngine(tiny_tokenizer, lambda prompt, r=reply: r), RuntimeConfig(), seed=0
        )
        scanned.clear()
        [result], _ = evaluator.run(MethodSpec("base"), [Problem("p", "math", "What is 200+4?", ["204"])], 64)
        assert result.correct == 1.0 and len(scanned) == 1, reply


def test_avg_at_k_averages_attempts(tiny_tokenizer) -> None:
    calls = {"n": 0}

    def flaky(prompt: str) -> str:  # right on every other attempt
        calls["n"] += 1
        return "Answer: 3" if calls["n"] % 2 else "Answer: 4"

    problems = [Problem("m1", "arithmetic", "Calculate the value of 1+2.", ["3"])]
    evaluator = Evaluator(ScriptedEngine(tiny_tokenizer, flaky), RuntimeConfig(), avg_k=4)
    [result], _ = evaluator.run(MethodSpec("base"), problems, 64)
    assert len(result.episodes) == 4 and result.correct == 0.5
    assert result.generated_tokens == sum(e.generated_tokens for e in result.episodes) / 4


def test_agentic_rag_on_real_2wiki_records(tiny_tokenizer) -> None:
    records = wiki_records(4)
    problems = [problem_from_record("qa", r) for r in records]
    golds = {r["question"]: r["answers"][0] for r in records}
    seen: list[str] = []

    def reader(prompt: str) -> str:
        user = _last_user(prompt)
        seen.append(user)
        question = next(q for q in golds if q in user)
        return f"Answer: {golds[question]}"

    evaluator = Evaluator(ScriptedEngine(tiny_tokenizer, reader), RuntimeConfig(), seed=0)
    spec = MethodSpec("agentic-rag", mode="rag", top_k=2, max_hops=2)
    results, _ = evaluator.run(spec, problems, 256)
    for problem, result in zip(problems, results, strict=True):
        hops = min(problem.num_hops, 2)
        assert len(result.episodes) == hops and result.extra["hops"] == hops
        assert len(result.extra["retrieved"]) == 2 * hops == len(set(result.extra["retrieved"]))
        assert result.correct == 1.0 and result.f1 == 1.0
        assert result.generated_tokens == result.critical_path_tokens <= 256  # hops run in sequence
    # The reader only ever saw retrieved paragraphs, never the whole context.
    assert all(user.count("\n[") + user.startswith("[") <= 4 for user in seen)
    with pytest.raises(ValueError):
        evaluator.run(spec, [Problem("a", "arithmetic", "q", ["1"])], 64)


def test_evaluate_cell_rows_and_records(tiny_tokenizer) -> None:
    problems = [problem_from_record("qa", r) for r in wiki_records(3)]
    golds = {p.question: p.golds[0] for p in problems}

    def policy(prompt: str) -> str:
        user = _last_user(prompt)
        if CLONE_SYSTEM_PROMPT in prompt:
            return "Answer: failed (not in my paragraphs)"
        if "<tool_response>" in user:
            return "Answer: <script>alert(1)</script>"
        if "spawn_clone" in prompt:
            return '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"task": "t", "context": ["nope"]}]}}\n</tool_call>'
        return f"Answer: {next(g for q, g in golds.items() if q in user)}"

    import io

    out = io.StringIO()
    methods = [MethodSpec("base"), MethodSpec("prompted", mode="delegate")]
    rows = evaluate_cell(
        Evaluator(ScriptedEngine(tiny_tokenizer, policy), RuntimeConfig()),
        methods,
        problems,
        [64, 128],
        meta={"dataset": "qa", "split": "dev", "checkpoint": "scripted"},
        resamples=200,
        records_out=out,
    )
    assert [(r["method"], r["budget"]) for r in rows] == [
        ("base", 64),
        ("base", 128),
        ("prompted", 64),
        ("prompted", 128),
    ]
    base, prompted = rows[1], rows[3]
    assert base["accuracy"] == 1.0 and base["f1"] == 1.0 and base["n"] == 3
    assert (
        prompted["accuracy"] == 0.0 and prompted["protocol_error_rate"] == 1.0 and prompted["clones"] == 1.0
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 4 * 3
    assert all("token_ids" not in agent for r in records for e in r["episodes"] for agent in e["agents"])
    assert {r["checkpoint"] for r in records} == {"scripted"}


# --------------------------------------------------------------------------- the stage, on the tiny model
def _stage_params(tmp_path: Path, checkpoint: Path) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["eval"]["checkpoint_dir"] = str(checkpoint.parent)
    params["eval"]["models"] = {
        checkpoint.name: {
            "base": {"mode": "monolithic"},
            "sc@2": {"mode": "monolithic", "samples": 2, "temperature": 0.7},
            "selfcest": {"mode": "delegate"},
            "agentic-rag": {"mode": "rag", "top_k": 2},
        },
        "absent_model": {"noclone-grpo": {"mode": "monolithic"}},
    }
    params["eval"]["budgets"] = {"arithmetic": [8, 16], "qa": [8, 16]}
    params["eval"]["sweep"].update(max_problems=3, bootstrap_resamples=50)
    params["eval"]["splits"] = {"arithmetic": ["test"], "qa": ["dev"], "math": []}
    params["eval"]["report"]["reference_budget"] = 16
    params["eval"]["report"]["claim_splits"] = ["arithmetic/test"]
    params["seed"] = 0
    params["eval"]["sweep"]["seed"] = 0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    return path


def test_eval_and_report_stages_on_the_tiny_model(tiny_checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    from stages import evaluate, report

    monkeypatch.chdir(tmp_path)
    params = _stage_params(tmp_path, tiny_checkpoint)
    for dataset, split, records in (
        ("arithmetic", "test", arithmetic_records(4)),
        ("qa", "dev", wiki_records(4)),
    ):
        (tmp_path / "data" / dataset).mkdir(parents=True)
        (tmp_path / "data" / dataset / f"{split}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8"
        )
        evaluate.main(
            ["--params", str(params), "--dataset", dataset, "--split", split, "--model", tiny_checkpoint.name]
        )
        cell = tmp_path / "artifacts" / "eval" / dataset / split / tiny_checkpoint.name
        payload = json.loads((cell / "rows.json").read_text())
        methods = ["base", "sc@2", "selfcest"] + (["agentic-rag"] if dataset == "qa" else [])
        assert payload["status"] == "ok" and payload["methods"] == methods
        weights = hashlib.sha256((tiny_checkpoint / "model.safetensors").read_bytes()).hexdigest()
        assert payload["weights_sha256"] == weights  # which weights produced the rows
        assert [(r["method"], r["budget"]) for r in payload["rows"]] == [
            (m, b) for m in methods for b in (8, 16)
        ]
        for row in payload["rows"]:
            assert row["n"] == 3 and 0.0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1.0
            assert row["gen_tokens"] <= row["budget"] and row["critical_tokens"] <= row["gen_tokens"]
            assert row["total_tokens"] > row["gen_tokens"] and ("f1" in row) == (dataset == "qa")
        with gzip.open(cell / "episodes.jsonl.gz", "rt") as handle:
            assert sum(1 for _ in handle) == len(payload["rows"]) * 3
        timing = payload["timing"]
        assert timing["import_seconds"] >= 0 and timing["run_seconds"] > 0
        assert set(timing["machine"]) == {"cpu_vendor", "cpu_model", "cpu_kernels", "torch", "gpu"}
        assert timing["machine"]["gpu"] is None  # a CPU cell
    # A math benchmark goes through its data stage first, as under DVC: prepare_math writes the
    # validated split that the cell reads.
    from stages import prepare_math

    values = yaml.safe_load(params.read_text(encoding="utf-8"))
    values["eval"]["splits"]["math"] = ["aime24"]
    values["eval"]["budgets"]["math"] = [8, 16]
    values["eval"]["math_sources"]["aime24"].update(path=str(AIME24), avg_k=2)
    params.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    prepare_math.main(["--params", str(params)])
    evaluate.main(
        ["--params", str(params), "--dataset", "math", "--split", "aime24", "--model", tiny_checkpoint.name]
    )
    math_cell = json.loads(
        (tmp_path / "artifacts/eval/math/aime24" / tiny_checkpoint.name / "rows.json").read_text()
    )
    assert math_cell["status"] == "ok" and math_cell["methods"] == ["base", "sc@2", "selfcest"]
    assert {r["n"] for r in math_cell["rows"]} == {3} and len(math_cell["rows"]) == 6
    # A checkpoint that does not exist yet gives a `missing` cell instead of failing.
    evaluate.main(
        ["--params", str(params), "--dataset", "arithmetic", "--split", "test", "--model", "absent_model"]
    )
    missing = json.loads((tmp_path / "artifacts/eval/arithmetic/test/absent_model/rows.json").read_text())
    assert missing["status"] == "missing" and missing["rows"] == []
    # A reference budget the report would refuse stops a cell before it loads its checkpoint.
    wrong = yaml.safe_load(params.read_text())
    wrong["eval"]["report"]["reference_budget"] = {"qa": 32}
    wrong_path = tmp_path / "wrong_params.yaml"
    wrong_path.write_text(yaml.safe_dump(wrong), encoding="utf-8")
    cell = ["--dataset", "qa", "--split", "dev", "--model", tiny_checkpoint.name]
    with pytest.raises(
        ValueError, match=r"reference_budget for qa is 32, which is not one of eval.budgets.qa"
    ):
        evaluate.main(["--params", str(wrong_path), *cell, "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()

    report.main(["--params", str(params)])
    out = tmp_path / "reports"
    header = (out / "sweep.csv").read_text().splitlines()[0].split(",")
    assert set(header) >= REQUIRED_SWEEP_COLUMNS
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["benchmarks"]) == {"arithmetic/test", "qa/dev", "math/aime24"}
    assert (out / "pareto" / "arithmetic_test.png").stat().st_size > 0
    summary = (out / "summary.md").read_text()
    assert "`noclone-grpo`" in summary and "Missing" in summary
    assert "<script" not in (out / "traces.html").read_text().lower()


def test_params_and_dvc_yaml_agree() -> None:
    """The eval section parses, and dvc.yaml's eval stages only name params and columns that exist."""
    from selfcest.reports import COLUMNS

    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["eval"]
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    methods = {
        name: MethodSpec.from_params(name, values)
        for per_checkpoint in params["models"].values()
        for name, values in per_checkpoint.items()
    }
    roles = params["report"]["claim_methods"]
    assert {roles["selfcest"], roles["base"], roles["prompted"], *roles["rivals"]} <= set(methods)
    for dataset in ("arithmetic", "qa", "math"):
        stage = dvc["stages"][f"eval_{dataset}"]
        assert (
            f"eval.budgets.{dataset}" in stage["params"] and params["budgets"][dataset]
        )  # DVC needs the key
        assert stage["matrix"]["split"] == f"${{eval.splits.{dataset}}}"
        assert f"artifacts/eval/{dataset}/${{item.split}}/${{item.model}}" in stage["outs"]
    for split in params["splits"]["math"]:
        assert split in params["math_sources"]
    for benchmark in params["report"]["claim_splits"]:
        dataset, split = benchmark.split("/")
        assert split in params["splits"][dataset]
    plots = {name: spec for entry in dvc["plots"] for name, spec in entry.items()}
    assert {spec["x"] for spec in plots.values()} == {"gen_tokens", "total_tokens", "critical_tokens"}
    assert all(spec["y"] == {"reports/sweep.csv": "accuracy"} for spec in plots.values())
    assert {spec["x"] for spec in plots.values()} <= set(COLUMNS)
    assert all((REPO / spec["template"]).exists() for spec in plots.values())


def test_runs_are_deterministic_on_the_tiny_model(tiny_model, tiny_tokenizer) -> None:
    """Greedy methods are deterministic, and seeded sampling (sc@k) repeats itself too."""
    from selfcest.engine import TransformersEngine

    problems = [problem_from_record("arithmetic", r) for r in arithmetic_records(3)]

    def run(spec: MethodSpec) -> list[tuple[Any, ...]]:
        evaluator = Evaluator(TransformersEngine(tiny_model, tiny_tokenizer), RuntimeConfig(), seed=3)
        results, _ = evaluator.run(spec, problems, 24)
        return [
            (r.answer, r.generated_tokens, r.total_tokens, r.critical_path_tokens, r.extra.get("votes"))
            for r in results
        ]

    for spec in (MethodSpec("base"), MethodSpec("sc@2", samples=2, temperature=1.0)):
        assert run(spec) == run(spec)


def _without_timings(value: Any) -> Any:
    """A row or record with every measured-seconds field removed, at any depth."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_max_problems_per_dataset_and_per_split() -> None:
    from stages.evaluate import max_problems_for

    assert max_problems_for(48, "qa", "test") == 48 and max_problems_for(None, "qa", "test") is None
    per_split = {"arithmetic": 48, "qa": {"default": 40, "musique_dev": 10}}
    assert max_problems_for(per_split, "arithmetic", "ood") == 48
    assert (
        max_problems_for(per_split, "qa", "test") == 40
        and max_problems_for(per_split, "qa", "musique_dev") == 10
    )
    assert max_problems_for(per_split, "math", "aime24") is None  # a dataset left out: every problem
    assert max_problems_for({"qa": {"musique_dev": 10}}, "qa", "test") is None  # no default: every problem
    for bad in (0, -3, 2.5, "48", True):
        with pytest.raises(ValueError, match=r"max_problems for qa/test must be a positive whole number"):
            max_problems_for({"qa": bad}, "qa", "test")


def test_a_per_dataset_or_per_split_mapping_names_only_datasets_and_splits() -> None:
    """A misspelt dataset or split key left that benchmark at the default: every problem, no
    budgets (a cell of no rows, written `ok`), or the middle budget as the reference."""
    from selfcest.sweep_config import settings_for
    from stages.evaluate import max_problems_for

    with pytest.raises(ValueError, match=r"eval.sweep.max_problems: unknown key\(s\) \['arithmetc'\]"):
        max_problems_for({"arithmetc": {"ood": 200, "default": 48}}, "arithmetic", "ood")
    splits = {"arithmetic": ["test", "ood"], "qa": ["test"]}
    per_split = {"arithmetic": {"oood": 200, "default": 48}}
    with pytest.raises(ValueError, match=r"eval.sweep.max_problems.arithmetic: unknown key\(s\) \['oood'\]"):
        max_problems_for(per_split, "arithmetic", "ood", splits=splits)
    assert (
        max_problems_for({"arithmetic": {"ood": 200, "default": 48}}, "arithmetic", "ood", splits=splits)
        == 200
    )
    with pytest.raises(ValueError, match=r"eval.budgets: unknown key\(s\) \['arithmetc'\]"):
        settings_for({"budgets": {"arithmetc": [128, 256]}}, "arithmetic")
    report = {"reference_budget": {"arithmetc": 512}}
    with pytest.raises(ValueError, match=r"eval.report.reference_budget: unknown key"):
        settings_for({"budgets": [128, 512], "report": report}, "arithmetic")
    with pytest.raises(ValueError, match=r"--max-problems for qa/test must be a positive whole number"):
        max_problems_for(0, "qa", "test", setting="--max-problems")


def test_a_params_section_that_is_not_a_mapping_is_refused_by_name() -> None:
    """`sweep: 48` stopped inside Python ("'int' object is not iterable"), a list of one mapping
    with "unhashable type", and `sweep: max_problems` was read as its letters."""
    from selfcest.param_checks import check_keys
    from selfcest.sweep_config import check_sweep_keys

    for bad in (48, [{"max_problems": 48}], ["max_problems"], "max_problems"):
        with pytest.raises(ValueError, match=r"^eval.sweep: expected a mapping of settings, got "):
            check_sweep_keys(bad)
    check_sweep_keys(None)  # unset: every default
    check_sweep_keys({"max_problems": 48})
    # `known` may be any iterable, read once: a generator's keys all count
    check_keys("s", {"a": 1, "b": 2}, (k for k in ("a", "b")))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['c'\]; its settings are \['a', 'b'\]"):
        check_keys("s", {"a": 1, "c": 2}, (k for k in ("a", "b")))


def test_a_frontier_range_that_is_not_positive_is_refused_before_the_sweep() -> None:
    from selfcest.sweep_config import settings_for

    for bad in (0, -5.0, True, "512", float("inf"), float("nan")):  # inf gave NaN frontier areas
        with pytest.raises(ValueError, match=r"eval.report.auc_max_tokens for qa must be a positive number"):
            settings_for({"budgets": [64, 128], "report": {"auc_max_tokens": {"qa": bad}}}, "qa")
    assert (
        settings_for({"budgets": [64, 128], "report": {"auc_max_tokens": 100}}, "qa").auc_max_tokens == 100.0
    )


def test_method_settings_that_a_mode_would_not_read_are_refused() -> None:
    """Each ran as another method under its name: a delegating root keeps its root prompt, so a
    `thinking` one was plain `prompted`; RAG answers once, so `samples: 4` voted nothing."""
    refused = {
        "thinking with delegate": dict(mode="delegate", system_prompt="thinking"),
        "unknown prompt": dict(system_prompt="Thinking"),
        "rag samples": dict(mode="rag", samples=4, temperature=0.7),
        "rag hops": dict(mode="rag", max_hops=0),
        "rag top_k": dict(mode="rag", top_k=0),
        # these failed only mid-cell, after its other units had run
        "fractional samples": dict(samples=2.5, temperature=0.7),
        "rag on arithmetic": dict(mode="rag", datasets=["qa", "arithmetic"]),
    }
    for case, values in refused.items():
        with pytest.raises(ValueError, match=r"method m: "):
            MethodSpec("m", **values)  # type: ignore[arg-type]
            pytest.fail(f"accepted: {case}")
    MethodSpec("thinking", system_prompt="thinking")
    MethodSpec("rag", mode="rag", top_k=3, max_hops=2)


def test_a_bad_split_record_is_named_by_file_and_line(tmp_path: Path) -> None:
    split = tmp_path / "test.jsonl"
    good = json.dumps({"id": "a", "expr": "1+2", "answer": 3})
    split.write_text(f"{good}\n\n{{bad json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(str(split))}, line 3: not a JSON record"):
        load_problems("arithmetic", split, max_problems=None, seed=0)
    split.write_text(f"{good}\n{json.dumps({'id': 'b', 'answer': 3})}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(str(split))}, line 2: missing field 'expr'"):
        load_problems("arithmetic", split, max_problems=None, seed=0)


def test_trace_problems_zero_shows_no_problem(tmp_path: Path) -> None:
    from selfcest.reports import _first_problem_ids

    path = tmp_path / "episodes.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"problem_id": "p1", "budget": 64}) + "\n")
    assert _first_problem_ids(path, None, 0) == []
    assert _first_problem_ids(path, None, 2) == ["p1"]


def test_a_misspelt_sweep_setting_stops_the_cell_naming_it(tmp_path: Path, monkeypatch) -> None:
    """The cells read `eval.sweep` with defaults: `max_problem: 3` ran every problem of the split."""
    from stages import evaluate

    monkeypatch.chdir(tmp_path)
    params = _stage_params(tmp_path, tmp_path / "checkpoints" / "tiny")
    values = yaml.safe_load(params.read_text(encoding="utf-8"))
    evaluate.check_sweep_keys(values["eval"]["sweep"])  # every key params.yaml has is read
    values["eval"]["sweep"]["max_problem"] = values["eval"]["sweep"].pop("max_problems")
    params.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    with pytest.raises(ValueError, match=r"eval.sweep: unknown key\(s\) \['max_problem'\]"):
        evaluate.main(
            ["--params", str(params), "--dataset", "arithmetic", "--split", "test", "--model", "tiny"]
        )
    assert not (tmp_path / "artifacts").exists()  # refused before it wrote anything


def test_a_cell_refuses_an_unknown_model_or_no_problems_before_it_writes(tmp_path: Path, monkeypatch) -> None:
    from stages import evaluate

    monkeypatch.chdir(tmp_path)
    params = _stage_params(tmp_path, tmp_path / "checkpoints" / "tiny")
    cell = ["--params", str(params), "--dataset", "arithmetic", "--split", "test"]
    with pytest.raises(
        ValueError, match=r"--model .tyni. is not a key of eval.models \(tiny, absent_model\)"
    ):
        evaluate.main([*cell, "--model", "tyni"])
    with pytest.raises(
        ValueError, match=r"--max-problems for arithmetic/test must be a positive whole number"
    ):
        evaluate.main([*cell, "--model", "tiny", "--max-problems", "0"])
    assert not (tmp_path / "artifacts").exists()


def _cell_payload(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(directory / "episodes.jsonl.gz", "rt") as handle:
        records = [json.loads(line) for line in handle]
    return json.loads((directory / "rows.json").read_text()), records


def test_a_killed_cell_resumes_from_its_journal(tiny_checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    """A cell killed part-way reads its finished (method, budget) units back on the rerun and runs
    only the rest: the same rows and records as an uninterrupted run, fewer engine calls. A rerun
    under other params does not read the journal of the killed run."""
    from selfcest.evaluation import Evaluator
    from stages import evaluate

    monkeypatch.chdir(tmp_path)
    params = _stage_params(tmp_path, tiny_checkpoint)
    (tmp_path / "data" / "arithmetic").mkdir(parents=True)
    (tmp_path / "data" / "arithmetic" / "test.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in arithmetic_records(4)), encoding="utf-8"
    )
    argv = [
        "--params",
        str(params),
        "--dataset",
        "arithmetic",
        "--split",
        "test",
        "--model",
        tiny_checkpoint.name,
    ]
    journal = tmp_path / "artifacts" / "runs" / "eval" / "arithmetic" / "test" / tiny_checkpoint.name
    cell = tmp_path / "artifacts" / "eval" / "arithmetic" / "test" / tiny_checkpoint.name
    evaluate.main([*argv, "--out", str(tmp_path / "fresh")])
    fresh, fresh_records = _cell_payload(tmp_path / "fresh")
    assert not journal.exists()  # removed once the rows are written,
    assert list((tmp_path / "artifacts" / "runs" / "eval").iterdir()) == []  # its empty folders too

    run = Evaluator.run

    def killed_at_selfcest(self: Evaluator, spec: MethodSpec, problems: Any, budget: int) -> Any:
        if spec.name == "selfcest":
            raise RuntimeError("killed")
        return run(self, spec, problems, budget)

    def kill() -> None:
        with monkeypatch.context() as patch:
            patch.setattr(Evaluator, "run", killed_at_selfcest)
            with pytest.raises(RuntimeError, match="killed"):
                evaluate.main(argv)
        # base and sc@2 finished at both budgets before selfcest's first unit
        assert sorted(p.name for p in journal.glob("unit-*")) == [
            "unit-000-16.json.gz", "unit-000-8.json.gz", "unit-001-16.json.gz", "unit-001-8.json.gz"
        ]  # fmt: skip

    kill()
    evaluate.main(argv)
    resumed, resumed_records = _cell_payload(cell)
    assert _without_timings(resumed["rows"]) == _without_timings(fresh["rows"])
    assert _without_timings(resumed_records) == _without_timings(fresh_records)
    assert 0 < resumed["timing"]["engine_calls"] < fresh["timing"]["engine_calls"]
    assert not journal.exists()

    # A journaled unit is read back, not rerun: a tampered entry shows. Under other params the
    # fingerprint differs, so the same tampered journal is cleared and every unit runs.
    kill()
    entry_path = journal / "unit-000-8.json.gz"
    with gzip.open(entry_path, "rt") as handle:
        entry = json.load(handle)
    entry["row"]["accuracy"] = 0.123
    with gzip.open(entry_path, "wt") as handle:
        json.dump(entry, handle)
    values = yaml.safe_load(params.read_text(encoding="utf-8"))
    values["eval"]["sweep"]["bootstrap_resamples"] = 60
    other = tmp_path / "other_params.yaml"
    other.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    evaluate.main(["--params", str(other), *argv[2:]])
    rerun, _ = _cell_payload(cell)
    assert 0.123 not in [r["accuracy"] for r in rerun["rows"]]
    assert rerun["timing"]["engine_calls"] == fresh["timing"]["engine_calls"]
    kill()
    with gzip.open(journal / "unit-000-8.json.gz", "wt") as handle:
        json.dump(entry, handle)
    evaluate.main(argv)
    tampered, _ = _cell_payload(cell)
    assert [r["accuracy"] for r in tampered["rows"]][0] == 0.123


def test_stage_in_two_worker_processes_matches_one_process(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`eval.sweep.workers: 2` forks the stage's process after the model is loaded and runs (method,
    budget) units in either process, in any order: the rows, the episode records and the engine's
    call count are those of one process but for the measured seconds, sampled methods included
    (each engine call seeds its own generator). Run as DVC runs it, in a process of its own."""
    import subprocess
    import sys

    params = _stage_params(tmp_path, tiny_checkpoint)
    (tmp_path / "data" / "arithmetic").mkdir(parents=True)
    (tmp_path / "data" / "arithmetic" / "test.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in arithmetic_records(4)), encoding="utf-8"
    )
    cells = {}
    for workers in (1, 2):
        values = yaml.safe_load(params.read_text(encoding="utf-8"))
        values["eval"]["sweep"].update(workers=workers, threads=1)
        values["eval"]["budgets"]["arithmetic"] = [8, 16, 24]
        path = tmp_path / f"params_{workers}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
        out = tmp_path / f"cell_{workers}"
        subprocess.run(
            [sys.executable, str(REPO / "stages" / "evaluate.py"), "--params", str(path), "--dataset",
             "arithmetic", "--split", "test", "--model", tiny_checkpoint.name, "--out", str(out)],
            cwd=tmp_path, check=True, timeout=300,
        )  # fmt: skip
        payload = json.loads((out / "rows.json").read_text())
        with gzip.open(out / "episodes.jsonl.gz", "rt") as handle:
            records = [json.loads(line) for line in handle]
        cells[workers] = (payload, records)
    (one, one_records), (two, two_records) = cells[1], cells[2]
    assert one["timing"]["workers"] == 1 and two["timing"]["workers"] == 2
    assert [(r["method"], r["budget"]) for r in two["rows"]] == [
        (m, b) for m in ("base", "sc@2", "selfcest") for b in (8, 16, 24)
    ]
    assert _without_timings(two["rows"]) == _without_timings(one["rows"])
    assert _without_timings(two_records) == _without_timings(one_records)
    assert two["timing"]["engine_calls"] == one["timing"]["engine_calls"] > 0
    assert any(r["gen_tokens"] > 0 for r in two["rows"])


def test_combined_costs_state_each_methods_rule() -> None:
    """sc@k samples run in parallel (tokens add, the critical path and latency are the slowest
    sample's); RAG hops run in series (everything adds); avg@k attempts average."""
    from selfcest.evaluation import combined_costs
    from selfcest.runtime import Episode

    def episode(gen: int, critical: int, seconds: float, clones: int, errors: int) -> Episode:
        return Episode(
            "p",
            0,
            "delegate",
            512,
            [],
            generated_tokens=gen,
            total_tokens=gen + 100,
            critical_path_tokens=critical,
            wall_seconds=seconds,
            num_clones=clones,
            protocol_errors=[{"kind": "x"}] * errors,
        )

    group = [episode(40, 30, 1.0, 2, 0), episode(60, 50, 3.0, 0, 1)]
    parallel, serial, mean = (combined_costs(group, rule) for rule in ("parallel", "serial", "mean"))
    assert parallel == {
        "generated_tokens": 100,
        "total_tokens": 300,
        "critical_path_tokens": 50,
        "latency_seconds": 3.0,
        "clones": 2,
        "protocol_error_rate": 0.5,
    }
    assert serial["critical_path_tokens"] == 80 and serial["latency_seconds"] == 4.0
    assert serial["generated_tokens"] == 100
    assert mean == {
        "generated_tokens": 50,
        "total_tokens": 150,
        "critical_path_tokens": 40,
        "latency_seconds": 2.0,
        "clones": 1,
        "protocol_error_rate": 0.5,
    }
    with pytest.raises(ValueError):
        combined_costs([], "mean")


def _stand_in_vllm(monkeypatch) -> list[dict[str, Any]]:
    """A `vllm` module with the parts `VLLMEngine` uses (LLM, SamplingParams, inputs.TokensPrompt),
    generating with `TransformersEngine` from vLLM's per-request settings. Returns the LLM kwargs seen."""
    import sys
    import types

    from selfcest.engine import GenerationRequest, SamplingConfig, TransformersEngine
    from selfcest.model import load_model
    from selfcest.tokenizer import load_tokenizer

    constructed: list[dict[str, Any]] = []

    class LLM:
        def __init__(self, model: str, tokenizer: str, **kwargs: Any) -> None:
            constructed.append({"model": model, "tokenizer": tokenizer, **kwargs})
            self.engine = TransformersEngine(load_model(model), load_tokenizer(tokenizer))

        def generate(self, prompts: list[dict], params: list[types.SimpleNamespace], use_tqdm: bool):
            outputs = []
            for prompt, p in zip(prompts, params, strict=True):  # vLLM seeds each request on its own
                request = GenerationRequest(prompt["prompt_token_ids"], p.max_tokens, tuple(p.stop or ()))
                sampling = SamplingConfig(temperature=p.temperature, top_p=p.top_p, seed=p.seed)
                [result] = self.engine.generate([request], sampling)
                completion = types.SimpleNamespace(
                    token_ids=tuple(result.token_ids),
                    text=result.text,
                    finish_reason=result.finish_reason,
                    logprobs=None,
                )
                outputs.append(types.SimpleNamespace(outputs=[completion]))
            return outputs

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM
    vllm.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return constructed


def test_eval_stage_on_the_vllm_engine_matches_transformers(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    """`eval.sweep.engine: vllm` goes through `VLLMEngine`; greedy rows match the transformers engine's."""
    from stages import evaluate

    constructed = _stand_in_vllm(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "arithmetic").mkdir(parents=True)
    (tmp_path / "data" / "arithmetic" / "test.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in arithmetic_records(4)), encoding="utf-8"
    )
    params_path = _stage_params(tmp_path, tiny_checkpoint)
    params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    params["eval"]["models"] = {
        tiny_checkpoint.name: {"base": {"mode": "monolithic"}, "selfcest": {"mode": "delegate"}}
    }

    def run_cell(engine: str, out: Path) -> list[dict[str, Any]]:
        params["eval"]["sweep"].update(engine=engine, vllm={"gpu_memory_utilization": 0.3})
        params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
        cell = ["--dataset", "arithmetic", "--split", "test", "--model", tiny_checkpoint.name]
        evaluate.main(["--params", str(params_path), *cell, "--out", str(out)])
        payload = json.loads((out / "rows.json").read_text())
        return [
            {k: v for k, v in r.items() if k not in ("seconds", "latency_seconds")} for r in payload["rows"]
        ]

    rows = {engine: run_cell(engine, tmp_path / engine) for engine in ("transformers", "vllm")}
    assert constructed == [
        {
            "model": str(tiny_checkpoint),
            "tokenizer": str(tiny_checkpoint),
            "gpu_memory_utilization": 0.3,
            "logprobs_mode": "processed_logprobs",
        }
    ]
    assert rows["vllm"] == rows["transformers"] and len(rows["vllm"]) == 4
    assert any(r["gen_tokens"] > 0 for r in rows["vllm"])
    with pytest.raises(ValueError, match="eval.sweep.engine"):
        run_cell("sglang", tmp_path / "x")
    with pytest.raises(ValueError, match="eval.sweep.engine"):  # before the checkpoint is opened
        evaluate.build_engine({"engine": "sglang"}, tmp_path / "no-such-checkpoint")


def test_runtime_params_build_the_config_and_a_misspelt_key_is_an_error() -> None:
    from omegaconf import OmegaConf

    committed = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[1] / "params.yaml"))
    config = runtime_config_from_params(committed["runtime"])
    assert config.max_clones_per_call == committed["runtime"]["max_clones_per_call"]
    assert config.root_reserve_tokens == committed["runtime"]["root_reserve_tokens"]
    assert runtime_config_from_params(None) == RuntimeConfig()
    with pytest.raises(ValueError, match=r"^runtime: unknown key\(s\) \['max_clone_per_call'\]"):
        runtime_config_from_params({"max_clone_per_call": 2, "max_turns": 3})


def test_agentic_rag_hops_draw_from_their_own_seeds(tiny_tokenizer) -> None:
    """A sampled RAG's hops are episodes of one task id, one agent and a first turn: without a seed of
    its own per hop, hop 2 would redraw hop 1's numbers on another prompt."""
    seeds: list[list[int | None]] = []

    class Recording(ScriptedEngine):
        def generate(self, requests, sampling):
            seeds.append([r.seed for r in requests])
            return super().generate(requests, sampling)

    problems = [problem_from_record("qa", r) for r in wiki_records(4) if r.get("num_hops", 2) >= 2][:1]
    engine = Recording(tiny_tokenizer, lambda prompt: "Answer: x")
    spec = MethodSpec("rag-sampled", mode="rag", top_k=1, max_hops=2, temperature=0.7)
    Evaluator(engine, RuntimeConfig(), seed=0).run(spec, problems, 256)
    assert len(seeds) == 2 and None not in seeds[0] + seeds[1]
    assert seeds[0] != seeds[1]
