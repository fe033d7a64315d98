"""Arithmetic evaluator, generator, splits and the generate_arithmetic stage."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
import sys
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
from digests import tree_digest
from hypothesis import given, settings
from hypothesis import strategies as st

from selfcest.data.arithmetic import (
    ArithmeticConfig,
    ArithmeticParseError,
    arithmetic_card,
    arithmetic_prompt,
    build_arithmetic_splits,
    canonical_jsonl,
    config_from_mapping,
    count_operators,
    evaluate_expression,
    generate_expression,
    split_content_hash,
)

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- evaluator: known cases


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("7", 7),
        ("12+7-3*45", -116),
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("2*3+4*5", 26),
        ("10-4-3", 3),  # left-associative
        ("10-(4-3)", 9),
        ("-3+4", 1),
        ("-3*4", -12),
        ("-(3+4)*2", -14),
        ("2*(-3)", -6),
        ("(-(-3))", 3),
        ("((((1))))", 1),
        (" 1 +\t2 ", 3),
        ("007+1", 8),
        ("99999999999*99999999999", 9999999999800000000001),  # exact, beyond int64
        ("123456789*987654321-121932631112635269", 0),
    ],
)
def test_evaluate_known_cases(expr: str, value: int) -> None:
    assert evaluate_expression(expr) == value


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("1+", "end of expression"),
        ("2*-3", "unexpected '-'"),
        ("--3", "unexpected '-'"),
        ("+3", "unexpected '+'"),
        ("(1+2", "end of expression"),
        ("1+2)", "unexpected ')'"),
        ("()", "unexpected ')'"),
        ("2(3)", "unexpected '('"),
        ("1/2", "unexpected character '/'"),
        ("2**3", "unexpected '*'"),
        ("1.5+1", "unexpected character '.'"),
        ("__import__('os')", "unexpected character '_'"),
        ("\u00b2+1", "unexpected character"),  # superscript two: str.isdigit() would accept it
    ],
)
def test_evaluate_rejects_malformed(expr: str, message: str) -> None:
    with pytest.raises(ArithmeticParseError, match=re.escape(message)):
        evaluate_expression(expr)


def test_evaluate_limits() -> None:
    with pytest.raises(ArithmeticParseError, match="longer than 10 characters"):
        evaluate_expression("1+1+1+1+1+1", max_chars=10)
    with pytest.raises(ArithmeticParseError, match="more than 5 tokens"):
        evaluate_expression("1+1+1+1", max_tokens=5)
    assert evaluate_expression("(" * 3 + "1" + ")" * 3, max_depth=3) == 1
    with pytest.raises(ArithmeticParseError, match="nested deeper than 3"):
        evaluate_expression("(" * 4 + "1" + ")" * 4, max_depth=3)
    # Default limits stop hostile input before it costs anything (no RecursionError, no huge ints).
    with pytest.raises(ArithmeticParseError, match="nested deeper"):
        evaluate_expression("(" * 100 + "1" + ")" * 100)
    with pytest.raises(ArithmeticParseError, match="longer than"):
        evaluate_expression("9" * 100_000)
    with pytest.raises(ArithmeticParseError):
        evaluate_expression(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- evaluator vs a reference

# Expression trees rendered to text with only the parentheses they need (plus random redundant
# ones); the value is computed on the tree with Python ints, independently of any parser.
# A node is (text, value, kind): kind "sum" if its top-level operator is + or -, "prod" for *,
# "atom" for a number or a parenthesised group.
Node = tuple[str, int, str]


def _paren(node: Node) -> str:
    return f"({node[0]})"


def _combine(op: str, left: Node, right: Node) -> Node:
    if op == "*":
        lt = _paren(left) if left[2] == "sum" else left[0]
        rt = _paren(right) if right[2] == "sum" else right[0]
        return f"{lt}*{rt}", left[1] * right[1], "prod"
    rt = _paren(right) if right[2] == "sum" else right[0]  # a-(b-c) != a-b-c
    value = left[1] + right[1] if op == "+" else left[1] - right[1]
    return f"{left[0]}{op}{rt}", value, "sum"


def _negate(node: Node) -> Node:
    inner = _paren(node) if node[2] == "sum" else node[0]
    return f"(-{inner})", -node[1], "atom"


_leaves = st.integers(min_value=0, max_value=10**12).map(lambda n: (str(n), n, "atom"))
_trees = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.builds(_combine, st.sampled_from("+-*"), children, children),
        children.map(_negate),
        children.map(lambda node: (_paren(node), node[1], "atom")),
    ),
    max_leaves=40,
)
_LOOSE = {"max_chars": 10**6, "max_tokens": 10**6, "max_depth": 200}


@settings(max_examples=300, deadline=None)
@given(tree=_trees, leading_minus=st.booleans())
def test_evaluate_matches_tree_reference(tree: Node, leading_minus: bool) -> None:
    text, value, kind = tree
    if leading_minus and kind != "sum":  # "-a*b" is -(a*b); "-a+b" is not -(a+b)
        text, value = "-" + text, -value
    assert evaluate_expression(text, **_LOOSE) == value


def _shunting_yard(expr: str) -> int:
    """Independent reference for generated expressions (binary + - * and parentheses only)."""
    precedence = {"+": 1, "-": 1, "*": 2}
    output: list[int] = []
    stack: list[str] = []

    def apply(op: str) -> None:
        b, a = output.pop(), output.pop()
        output.append(a + b if op == "+" else a - b if op == "-" else a * b)

    for token in re.findall(r"\d+|[-+*()]", expr):
        if token.isdigit():
            output.append(int(token))
        elif token == "(":
            stack.append(token)
        elif token == ")":
            while stack[-1] != "(":
                apply(stack.pop())
            stack.pop()
        else:
            while stack and stack[-1] != "(" and precedence[stack[-1]] >= precedence[token]:
                apply(stack.pop())
            stack.append(token)
    while stack:
        apply(stack.pop())
    (result,) = output
    return result


# --------------------------------------------------------------------------- generator


def _paren_groups(expr: str) -> list[str]:
    return re.findall(r"\(([^()]*)\)", expr)


def test_paper_generator_distribution() -> None:
    config = ArithmeticConfig()
    rng = random.Random(0)
    samples = [generate_expression(config, rng) for _ in range(400)]
    with_parens = 0
    for expr, value in samples:
        assert " " not in expr
        assert 3 <= count_operators(expr) <= 10
        assert all(3 <= len(n) <= 7 and n[0] != "0" for n in re.findall(r"\d+", expr))
        assert len(str(abs(value))) <= 16
        assert value == _shunting_yard(expr) == evaluate_expression(expr)
        groups = _paren_groups(expr)
        assert len(groups) == expr.count("(") <= 2  # at most 2 pairs, never nested
        for group in groups:  # parentheses only where they change the value
            assert "+" in group or "-" in group
        with_parens += bool(groups)
    # Paper: each +/- next to a * is wrapped with p=0.55, so most expressions get parentheses.
    assert 0.4 < with_parens / len(samples) < 0.95
    assert {"+", "-", "*"} <= set("".join(expr for expr, _ in samples))


def test_tiny_generator_distribution() -> None:
    config = config_from_mapping(
        {
            "operator_weights": {"+": 4, "-": 3, "*": 0},
            "operand_digits": [1, 2],
            "num_operators": [1, 3],
            "paren_max_pairs": 0,
        }
    )
    rng = random.Random(1)
    for _ in range(300):
        expr, value = generate_expression(config, rng)
        assert "*" not in expr and "(" not in expr
        assert 1 <= count_operators(expr) <= 3
        assert all(1 <= len(n) <= 2 for n in re.findall(r"\d+", expr))
        assert value == _shunting_yard(expr)


def test_result_digit_bound_resamples_and_gives_up() -> None:
    rng = random.Random(2)
    config = ArithmeticConfig(max_result_digits=4, operand_digits=(2, 2), num_operators=(2, 2))
    for _ in range(100):
        _, value = generate_expression(config, rng)
        assert len(str(abs(value))) <= 4
    impossible = ArithmeticConfig(
        operator_weights={"*": 1}, operand_digits=(5, 5), num_operators=(3, 3), max_attempts=10
    )
    with pytest.raises(RuntimeError, match="10 attempts"):
        generate_expression(impossible, rng)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="operator_weights"):
        ArithmeticConfig(operator_weights={"/": 1})
    with pytest.raises(ValueError, match="num_operators"):
        ArithmeticConfig(num_operators=(5, 3))
    with pytest.raises(ValueError, match=r"^ArithmeticConfig: unknown key\(s\) \['num_operator'\]"):
        config_from_mapping({"num_operator": [1, 2]})
    assert ArithmeticConfig(operand_digits=[3, 7]) == ArithmeticConfig()  # type: ignore[arg-type]


def test_prompt() -> None:
    assert arithmetic_prompt("12+7-3*45") == "Calculate the value of 12+7-3*45."


def test_prompt_matches_prompts_module() -> None:
    prompts = pytest.importorskip("selfcest.prompts")
    if not hasattr(prompts, "arithmetic_question"):
        pytest.skip("selfcest.prompts.arithmetic_question not defined")
    assert prompts.arithmetic_question("1+2") == arithmetic_prompt("1+2")


# --------------------------------------------------------------------------- splits


def _small_params(seed: int = 7) -> dict[str, Any]:
    return {
        "seed": seed,
        "profile": "tiny",
        "test_fraction": 0.1,
        "profiles": {
            "tiny": {
                "generator": {
                    "operator_weights": {"+": 4, "-": 3, "*": 0},
                    "operand_digits": [1, 2],
                    "paren_local_prob": 0.0,
                    "paren_max_pairs": 0,
                    "paren_wide_prob": 0.0,
                },
                "tiers": {
                    "easy": {"num_operators": [1, 3], "count": 120},
                    "medium": {"num_operators": [4, 5], "count": 60},
                    "hard": {"num_operators": [6, 7], "count": 40},
                },
                "ood": {"num_operators": [11, 19], "count": 30},
            },
            "paper": {
                "generator": {},
                "tiers": {"paper": {"num_operators": [3, 10], "count": 50}},
                "ood": None,
            },
        },
    }


def test_splits_structure_and_properties() -> None:
    splits = build_arithmetic_splits(_small_params())
    assert set(splits) == {"train", "test", "ood", "rl"}
    assert [len(splits[s]) for s in ("train", "test", "ood", "rl")] == [198, 22, 30, 0]
    card = arithmetic_card(splits)
    assert card["splits"]["test"]["tiers"] == {"easy": 12, "hard": 4, "medium": 6}
    ranges = {"easy": (1, 3), "medium": (4, 5), "hard": (6, 7), "ood": (11, 19)}
    for name, records in splits.items():
        for r in records:
            assert set(r) == {
                "id",
                "expr",
                "prompt",
                "answer",
                "num_operators",
                "num_operands",
                "tier",
                "split",
            }
            assert r["split"] == name
            lo, hi = ranges[r["tier"]]
            assert lo <= r["num_operators"] <= hi
            assert r["num_operands"] == r["num_operators"] + 1
            assert r["answer"] == str(evaluate_expression(r["expr"]))
            assert r["prompt"] == arithmetic_prompt(r["expr"])
            assert r["id"] == "arith-" + hashlib.sha256(r["expr"].encode()).hexdigest()[:16]
    train_max = max(r["num_operators"] for r in splits["train"])
    assert min(r["num_operators"] for r in splits["ood"]) > train_max  # OOD strictly longer
    exprs = [r["expr"] for records in splits.values() for r in records]
    assert len(exprs) == len(set(exprs))  # no duplicates, so no leakage across splits


def test_splits_deterministic_and_seed_sensitive() -> None:
    first = arithmetic_card(build_arithmetic_splits(_small_params(seed=7)))
    again = arithmetic_card(build_arithmetic_splits(_small_params(seed=7)))
    other = arithmetic_card(build_arithmetic_splits(_small_params(seed=8)))
    for name in ("train", "test", "ood"):
        assert first["splits"][name]["sha256"] == again["splits"][name]["sha256"]
        assert first["splits"][name]["sha256"] != other["splits"][name]["sha256"]


def test_tier_streams_are_independent() -> None:
    # Changing one tier's count must not reshuffle the problems of the other tiers.
    params = _small_params()
    changed = deepcopy(params)
    changed["profiles"]["tiny"]["tiers"]["hard"]["count"] = 80
    ood = [r["expr"] for r in build_arithmetic_splits(params)["ood"]]
    assert ood == [r["expr"] for r in build_arithmetic_splits(changed)["ood"]]


def test_the_rl_split_is_longer_than_the_tiers_and_leaves_the_other_splits_as_they_were() -> None:
    params = _small_params()
    with_rl = deepcopy(params)
    with_rl["profiles"]["tiny"]["rl"] = {"num_operators": [8, 10], "count": 25}
    before, after = build_arithmetic_splits(params), build_arithmetic_splits(with_rl)
    assert before["rl"] == []  # no `rl` in the profile: an empty split
    assert len(after["rl"]) == 25
    assert {r["num_operators"] for r in after["rl"]} <= {8, 9, 10}
    assert {(r["tier"], r["split"]) for r in after["rl"]} == {("rl", "rl")}
    for name in ("train", "test", "ood"):  # the warm-up's and evaluation's files keep their bytes
        assert split_content_hash(after[name]) == split_content_hash(before[name])
    # ood must stay longer than everything trained on, rl included; rl longer than every tier
    too_long = deepcopy(with_rl)
    too_long["profiles"]["tiny"]["rl"]["num_operators"] = [8, 11]
    with pytest.raises(ValueError, match="ood must use more operators than rl: min 11 <= max rl 11"):
        build_arithmetic_splits(too_long)
    too_short = deepcopy(with_rl)
    too_short["profiles"]["tiny"]["rl"]["num_operators"] = [7, 10]
    with pytest.raises(
        ValueError, match=r"arithmetic\.profiles\.tiny\.rl must use more operators than any tier"
    ):
        build_arithmetic_splits(too_short)


def test_splits_reject_bad_params() -> None:
    params = _small_params()
    params["profiles"]["tiny"]["ood"]["num_operators"] = [7, 12]
    with pytest.raises(ValueError, match="ood must use more operators"):
        build_arithmetic_splits(params)
    params = _small_params()
    params["profile"] = "huge"
    with pytest.raises(ValueError, match="not in arithmetic.profiles"):
        build_arithmetic_splits(params)
    params = _small_params()
    # 1-operator sums/differences of 1-digit operands: only 9 * 2 * 9 = 162 distinct problems.
    params["profiles"]["tiny"]["tiers"]["easy"] = {
        "num_operators": [1, 1],
        "operand_digits": [1, 1],
        "count": 300,
    }
    with pytest.raises(
        RuntimeError, match=r"^arithmetic\.profiles\.tiny\.tiers\.easy: .*distinct expressions"
    ):
        build_arithmetic_splits(params)
    params = _small_params()
    # no 3-operator product of 5-digit operands fits in 4 result digits: the error names the tier
    params["profiles"]["tiny"]["tiers"]["medium"].update(
        operator_weights={"*": 1}, operand_digits=[5, 5], max_result_digits=4, max_attempts=5
    )
    with pytest.raises(
        RuntimeError, match=r"^arithmetic\.profiles\.tiny\.tiers\.medium: no expression within 4"
    ):
        build_arithmetic_splits(params)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("tiers", "hard", "num_operator"),
            [6, 7],
            r"^arithmetic\.profiles\.tiny\.tiers\.hard: unknown key\(s\)",
        ),
        (
            ("tiers", "medium", "num_operators"),
            [5, 4],
            r"^arithmetic\.profiles\.tiny\.tiers\.medium: num_operators",
        ),
        (
            ("tiers", "easy", "count"),
            "many",
            r"^arithmetic\.profiles\.tiny\.tiers\.easy\.count: expected an integer",
        ),
        (
            ("tiers", "easy", "count"),
            True,
            r"^arithmetic\.profiles\.tiny\.tiers\.easy\.count: expected an integer",
        ),
        (("ood", "operand_digits"), [0, 1], r"^arithmetic\.profiles\.tiny\.ood: operand_digits"),
        (
            ("generator", "operator_weights"),
            {"/": 1},
            r"^arithmetic\.profiles\.tiny\.generator: operator_weights",
        ),
        (("generator", "max_result_digit"), 9, r"^arithmetic\.profiles\.tiny\.generator: unknown key\(s\)"),
        (
            ("tiers", "hard", "operator_weights"),
            None,  # `operator_weights:` left empty in YAML
            r"^arithmetic\.profiles\.tiny\.tiers\.hard: operator_weights must map",
        ),
        (
            ("oood",),
            {"num_operators": [11, 19], "count": 30},
            r"^arithmetic\.profiles\.tiny: unknown key\(s\) \['oood'\]",
        ),
    ],
)
def test_a_bad_profile_setting_names_its_params_path(path: tuple[str, ...], value: Any, message: str) -> None:
    """A typo or bad value in one tier used to raise without saying which tier or section held it
    (`unknown ArithmeticConfig fields`, `KeyError: 'count'`, `int('many')`)."""
    params = _small_params()
    entry = params["profiles"]["tiny"]
    for key in path[:-1]:
        entry = entry[key]
    entry[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        build_arithmetic_splits(params)
    del entry[path[-1]]
    if path[-1] == "count":
        with pytest.raises(ValueError, match=message):  # a tier without a count
            build_arithmetic_splits(params)


def test_a_misspelt_top_level_arithmetic_setting_is_refused() -> None:
    """`test_fracton: 0.5` ran with the default 0.1, unnoticed."""
    params = _small_params() | {"test_fracton": 0.5}
    with pytest.raises(ValueError, match=r"^arithmetic: unknown key\(s\) \['test_fracton'\]"):
        build_arithmetic_splits(params)


def test_paper_profile_without_ood() -> None:
    params = _small_params()
    params["profile"] = "paper"
    splits = build_arithmetic_splits(params)
    assert (len(splits["train"]), len(splits["test"]), len(splits["ood"])) == (45, 5, 0)
    assert all(3 <= r["num_operators"] <= 10 for r in splits["train"])


def test_canonical_hash_is_order_and_content_sensitive() -> None:
    records = [{"b": 1, "a": "x"}, {"a": "y", "b": 2}]
    assert canonical_jsonl(records) == '{"a":"x","b":1}\n{"a":"y","b":2}\n'
    assert split_content_hash(records) == hashlib.sha256(canonical_jsonl(records).encode()).hexdigest()
    assert split_content_hash(records) != split_content_hash(records[::-1])


def test_params_yaml_profiles() -> None:
    from omegaconf import OmegaConf

    params = OmegaConf.to_container(OmegaConf.load(REPO / "params.yaml"), resolve=True)["arithmetic"]
    assert params["profile"] == "tiny"
    assert params["seed"] == OmegaConf.load(REPO / "params.yaml")["seed"]
    paper = params["profiles"]["paper"]
    # The paper profile spells out the release's constants, which are also the dataclass defaults.
    assert config_from_mapping(paper["generator"]) == ArithmeticConfig()
    assert [tuple(t["num_operators"]) for t in paper["tiers"].values()] == [ArithmeticConfig().num_operators]
    splits = build_arithmetic_splits(params)  # the default profile builds in well under a second
    card = arithmetic_card(splits)["splits"]
    assert card["test"]["count"] == round(0.1 * (card["train"]["count"] + card["test"]["count"]))
    assert min(int(k) for k in card["ood"]["num_operators"]) > max(
        int(k) for k in card["train"]["num_operators"]
    )
    assert all(set(r["expr"]) <= set("0123456789+-") for r in splits["train"])


# --------------------------------------------------------------------------- stage end-to-end


def _run_stage(args: list[str]) -> None:
    spec = importlib.util.spec_from_file_location(
        "generate_arithmetic_stage", REPO / "stages" / "generate_arithmetic.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(args)


def test_stage_end_to_end(tmp_path: Path) -> None:
    import datasets
    from omegaconf import OmegaConf

    params = _small_params()
    params["seed"] = "${seed}"  # exercise the interpolation the real params.yaml uses
    params_file = tmp_path / "params.yaml"
    OmegaConf.save(OmegaConf.create({"seed": 11, "arithmetic": params}), params_file)

    outputs = []
    for run in ("a", "b"):
        out, card_file = tmp_path / run / "data", tmp_path / run / "card.json"
        _run_stage(["--params", str(params_file), "--out", str(out), "--card", str(card_file)])
        outputs.append((out, card_file))

    (out_a, card_a), (out_b, card_b) = outputs
    # Same seed, same bytes: JSONL, data card, and the Arrow files written by save_to_disk.
    assert tree_digest(out_a) == tree_digest(out_b)
    assert card_a.read_bytes() == card_b.read_bytes()

    card = json.loads(card_a.read_text())
    assert card["seed"] == 11 and card["profile"] == "tiny"
    loaded = datasets.load_from_disk(str(out_a))
    assert set(loaded) == {"train", "test", "ood"}
    for name in ("train", "test", "ood"):
        jsonl = (out_a / f"{name}.jsonl").read_bytes()
        assert hashlib.sha256(jsonl).hexdigest() == card["splits"][name]["sha256"]
        records = [json.loads(line) for line in jsonl.decode().splitlines()]
        assert loaded[name].to_list() == records
        assert card["splits"][name]["count"] == len(records)
    assert loaded["train"].features["answer"].dtype == "string"
    assert "| ood | 30 |" in (out_a / "README.md").read_text()


def test_stage_paper_profile_without_ood(tmp_path: Path) -> None:
    import datasets
    from omegaconf import OmegaConf

    params = _small_params()
    params["profile"] = "paper"
    params_file = tmp_path / "params.yaml"
    OmegaConf.save(OmegaConf.create({"arithmetic": params}), params_file)
    out = tmp_path / "data"
    _run_stage(["--params", str(params_file), "--out", str(out), "--card", str(tmp_path / "card.json")])
    loaded = datasets.load_from_disk(str(out))
    assert set(loaded) == {"train", "test"}  # the empty ood split is only in the JSONL and card
    assert (loaded["train"].num_rows, loaded["test"].num_rows) == (45, 5)
    assert json.loads((tmp_path / "card.json").read_text())["splits"]["ood"]["count"] == 0
    assert (out / "ood.jsonl").read_text() == ""


def test_stage_without_a_profile_uses_the_librarys_default(tmp_path: Path) -> None:
    """The library reads a missing `profile` as `tiny`; the stage (its card, its README) must too."""
    from omegaconf import OmegaConf

    params = _small_params()
    del params["profile"]
    params_file = tmp_path / "params.yaml"
    OmegaConf.save(OmegaConf.create({"arithmetic": params}), params_file)
    card = tmp_path / "card.json"
    _run_stage(["--params", str(params_file), "--out", str(tmp_path / "data"), "--card", str(card)])
    assert json.loads(card.read_text())["profile"] == "tiny"
    assert "(profile `tiny`" in (tmp_path / "data" / "README.md").read_text()


def test_read_jsonl_names_the_file_and_line_of_a_broken_record(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from stages.common import read_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.jsonl, line 3: not a JSON record"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n\n{"a": 2}\n', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_held_out_expressions_are_read_in_order_and_a_record_without_expr_is_named(tmp_path: Path) -> None:
    """The warm-up read the held-out splits with `record["expr"]`, so a record without one stopped it
    with a bare KeyError; both stages now share one reader that names the file and line."""
    sys.path.insert(0, str(REPO))
    from stages.common import held_out_expressions

    test, ood = tmp_path / "test.jsonl", tmp_path / "ood.jsonl"
    test.write_text('{"expr": "1+2"}\n\n{"expr": "3-1"}\n', encoding="utf-8")
    ood.write_text('{"expr": "4+4"}\n{"id": "o1"}\n', encoding="utf-8")
    assert held_out_expressions([test]) == ["1+2", "3-1"]
    with pytest.raises(ValueError, match=r"ood\.jsonl, line 2: a held-out split's record needs an 'expr'"):
        held_out_expressions([test, ood])


def test_test_split_has_the_tiers_operator_mix_when_rare_shapes_run_out() -> None:
    """With single-digit operands a 1-3 operator tier has only 162 one-operator problems; repeats are
    rejected, so they come up early in the draws. The test split must still be a uniform sample of the
    tier (it used to be its first draws: 27% one-operator problems against 3% in train)."""
    params = _small_params()
    tiny = params["profiles"]["tiny"]
    tiny["generator"]["operand_digits"] = [1, 1]
    tiny["tiers"] = {"easy": {"num_operators": [1, 3], "count": 3000}}
    splits = build_arithmetic_splits(params)

    def one_operator_share(split: str) -> float:
        return sum(r["num_operators"] == 1 for r in splits[split]) / len(splits[split])

    assert len(splits["test"]) == 300
    assert one_operator_share("train") > 0.02  # the tier does have them
    assert abs(one_operator_share("test") - one_operator_share("train")) < 0.04


@pytest.mark.parametrize(
    ("count", "fraction", "message"),
    [
        # round(0.1 * 5) == round(0.5) == 0: Python rounds halves to even
        (5, 0.1, r"count 5 at arithmetic\.test_fraction 0\.1 gives 0 test .*at least 6"),
        (3, 0.1, r"count 3 at arithmetic\.test_fraction 0\.1 gives 0 test .*at least 6"),
        (1, 0.6, r"count 1 at arithmetic\.test_fraction 0\.6 gives 1 test and 0 train .*at least 2"),
    ],
)
def test_a_tier_too_small_for_both_splits_is_refused(count: int, fraction: float, message: str) -> None:
    """A 5-problem tier at test_fraction 0.1 got round(0.5) == 0 test problems: the test split had
    none of that tier, and nothing said so."""
    params = _small_params()
    params["test_fraction"] = fraction
    params["profiles"]["tiny"]["tiers"]["hard"]["count"] = count
    with pytest.raises(ValueError, match=r"^arithmetic\.profiles\.tiny\.tiers\.hard: " + message):
        build_arithmetic_splits(params)


def test_tier_split_sizes_that_give_both_splits_are_unchanged() -> None:
    params = _small_params()
    params["profiles"]["tiny"]["tiers"]["hard"]["count"] = 6  # round(0.6) == 1: the smallest that works
    card = arithmetic_card(build_arithmetic_splits(params))["splits"]
    assert card["test"]["tiers"]["hard"] == 1 and card["train"]["tiers"]["hard"] == 5
    params["profiles"]["tiny"]["tiers"]["hard"]["count"] = 25  # round(2.5) == 2, as the committed data
    card = arithmetic_card(build_arithmetic_splits(params))["splits"]
    assert card["test"]["tiers"]["hard"] == 2
    # test_fraction 0 asks for no test split: tiers of any size are fine
    params["test_fraction"] = 0.0
    params["profiles"]["tiny"]["tiers"]["hard"]["count"] = 1
    splits = build_arithmetic_splits(params)
    assert splits["test"] == [] and len(splits["train"]) == 120 + 60 + 1


@pytest.mark.parametrize(
    ("medium", "hard", "shown"),
    [
        ([4, 6], [6, 7], r"medium \(num_operators \[4, 6\]\) and .*tiers\.hard \(num_operators \[6, 7\]\)"),
        ([4, 5], [1, 9], r"easy \(num_operators \[1, 3\]\) and .*tiers\.hard \(num_operators \[1, 9\]\)"),
    ],
)
def test_tiers_with_overlapping_operator_ranges_are_refused(
    medium: list[int], hard: list[int], shown: str
) -> None:
    """Expressions are unique across tiers, so a tier skipped what an earlier tier with an overlapping
    operator range drew: raising one tier's count changed another tier's problems."""
    params = _small_params()
    tiers = params["profiles"]["tiny"]["tiers"]
    tiers["medium"]["num_operators"] = medium
    tiers["hard"]["num_operators"] = hard
    with pytest.raises(ValueError, match=r"^arithmetic\.profiles\.tiny\.tiers\." + shown + " overlap"):
        build_arithmetic_splits(params)


def test_a_tiers_problems_do_not_depend_on_another_tiers_count() -> None:
    params = _small_params()
    changed = deepcopy(params)
    changed["profiles"]["tiny"]["tiers"]["easy"]["count"] = 400

    def tier_problems(splits: dict[str, list[dict[str, Any]]], tier: str) -> set[str]:
        return {r["expr"] for name in ("train", "test") for r in splits[name] if r["tier"] == tier}

    before, after = build_arithmetic_splits(params), build_arithmetic_splits(changed)
    for tier in ("medium", "hard"):
        assert tier_problems(before, tier) == tier_problems(after, tier)
