"""Synthetic arithmetic problems: a safe exact evaluator and the paper's expression generator.

The evaluator is a hand-written tokenizer plus recursive-descent parser over integers, `+ - *`,
parentheses and a unary minus; it never calls `eval` (model output and config-built strings go
through it) and Python ints keep every result exact.

The generator follows the released SELFCEST data recipe (PAPER.md, "Data in the release"): a flat
`a op b op c ...` sequence, then parentheses injected around `+`/`-` pairs that sit next to a `*`
(where they change the value), plus at most one wide span, rejection-sampled until the result
has at most `max_result_digits` digits. `build_arithmetic_splits` turns the `arithmetic:` section
of params.yaml into train/test/ood/rl record lists.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

from selfcest.param_checks import check_keys, int_setting

__all__ = [
    "ARITHMETIC_PROMPT_TEMPLATE",
    "ArithmeticConfig",
    "ArithmeticParseError",
    "arithmetic_card",
    "arithmetic_prompt",
    "build_arithmetic_splits",
    "canonical_jsonl",
    "config_from_mapping",
    "count_operators",
    "evaluate_expression",
    "generate_expression",
    "split_content_hash",
]

ARITHMETIC_PROMPT_TEMPLATE = "Calculate the value of {expr}."

# Evaluator limits. They bound work and recursion on untrusted text: 2,000 characters keep every
# operand and product far below CPython's 4,300-digit int/str conversion limit.
DEFAULT_MAX_CHARS = 2000
DEFAULT_MAX_TOKENS = 1000
DEFAULT_MAX_DEPTH = 32

# `rl`: problems that only GRPO trains on (the warm-up never sees them); empty without a profile `rl`.
SPLITS = ("train", "test", "ood", "rl")


# --------------------------------------------------------------------------- evaluator


class ArithmeticParseError(ValueError):
    """The text is not a well-formed arithmetic expression, or it exceeds a size limit."""


class _Token(NamedTuple):
    kind: str  # "int" or one of "+-*()"
    text: str
    pos: int  # character offset, for error messages


def _tokenize(text: str, max_tokens: int) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t":
            i += 1
            continue
        if "0" <= ch <= "9":  # ASCII only: str.isdigit() would accept superscripts and other scripts
            j = i + 1
            while j < n and "0" <= text[j] <= "9":
                j += 1
            tokens.append(_Token("int", text[i:j], i))
            i = j
        elif ch in "+-*()":
            tokens.append(_Token(ch, ch, i))
            i += 1
        else:
            raise ArithmeticParseError(f"unexpected character {ch!r} at position {i}")
        if len(tokens) > max_tokens:
            raise ArithmeticParseError(f"expression has more than {max_tokens} tokens")
    return tokens


class _Parser:
    """Grammar (unary minus only at the start of an expression, i.e. also right after '('):

    expr   := ['-'] term (('+' | '-') term)*
    term   := factor ('*' factor)*
    factor := INT | '(' expr ')'

    Chains of + and * are loops, so only parentheses recurse, and `max_depth` bounds them.
    """

    def __init__(self, tokens: list[_Token], max_depth: int) -> None:
        self.tokens = tokens
        self.pos = 0
        self.max_depth = max_depth

    def _peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _unexpected(self, token: _Token | None) -> ArithmeticParseError:
        if token is None:
            return ArithmeticParseError("unexpected end of expression")
        return ArithmeticParseError(f"unexpected {token.text!r} at position {token.pos}")

    def parse(self) -> int:
        value = self._expr(0)
        if self.pos != len(self.tokens):
            raise self._unexpected(self.tokens[self.pos])
        return value

    def _expr(self, depth: int) -> int:
        token = self._peek()
        negate = token is not None and token.kind == "-"
        if negate:
            self.pos += 1
        value = self._term(depth)
        if negate:
            value = -value
        while (token := self._peek()) is not None and token.kind in "+-":
            self.pos += 1
            rhs = self._term(depth)
            value = value + rhs if token.kind == "+" else value - rhs
        return value

    def _term(self, depth: int) -> int:
        value = self._factor(depth)
        while (token := self._peek()) is not None and token.kind == "*":
            self.pos += 1
            value *= self._factor(depth)
        return value

    def _factor(self, depth: int) -> int:
        token = self._peek()
        if token is not None and token.kind == "int":
            self.pos += 1
            return int(token.text)
        if token is not None and token.kind == "(":
            if depth >= self.max_depth:
                raise ArithmeticParseError(
                    f"parentheses nested deeper than {self.max_depth} (at position {token.pos})"
                )
            self.pos += 1
            value = self._expr(depth + 1)
            closing = self._peek()
            if closing is None or closing.kind != ")":
                raise self._unexpected(closing)
            self.pos += 1
            return value
        raise self._unexpected(token)


def evaluate_expression(
    text: str,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> int:
    """Exact value of an integer expression with `+ - *`, parentheses and a leading unary minus.

    Spaces and tabs are ignored. `2*-3` and `--3` are rejected (unary minus is allowed only at the
    start of an expression or right after '('). Raises `ArithmeticParseError` on malformed input
    or when the text exceeds `max_chars` characters, `max_tokens` tokens or `max_depth` nested
    parentheses.
    """
    if not isinstance(text, str):
        raise ArithmeticParseError(f"expected a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ArithmeticParseError(f"expression longer than {max_chars} characters ({len(text)})")
    tokens = _tokenize(text, max_tokens)
    if not tokens:
        raise ArithmeticParseError("empty expression")
    return _Parser(tokens, max_depth).parse()


def count_operators(expr: str) -> int:
    """Number of binary operators in a generated expression (the generator emits no unary minus)."""
    return sum(expr.count(op) for op in "+-*")


def arithmetic_prompt(expr: str) -> str:
    """The paper's root prompt for an arithmetic problem."""
    return ARITHMETIC_PROMPT_TEMPLATE.format(expr=expr)


# --------------------------------------------------------------------------- generator


@dataclass(frozen=True)
class ArithmeticConfig:
    """Distribution of generated expressions. Defaults are the paper's (released) constants.

    Parameters:
        operator_weights (`dict[str, float]`, defaults to `{"+": 4, "-": 3, "*": 6}`):
            Relative sampling weights of the binary operators; a weight of 0 disables one.
        operand_digits (`tuple[int, int]`, defaults to `(3, 7)`):
            Inclusive range of operand lengths in digits, drawn uniformly per operand. Operands are
            positive with a non-zero leading digit.
        num_operators (`tuple[int, int]`, defaults to `(3, 10)`):
            Inclusive range of the number of binary operators, drawn uniformly per expression. The
            tiers of one profile must have disjoint ranges (`build_arithmetic_splits`).
        max_result_digits (`int`, defaults to `16`):
            Expressions whose |value| has more digits are discarded and resampled.
        paren_local_prob (`float`, defaults to `0.55`):
            Probability of wrapping each `a+b` / `a-b` pair that is adjacent to a `*` in parentheses.
        paren_max_pairs (`int`, defaults to `2`):
            Maximum number of parenthesis pairs (local pairs plus the wide span) per expression.
        paren_wide_prob (`float`, defaults to `0.22`):
            Probability of adding one wider span, if the pair budget allows it. The span only
            appears when it overlaps no local pair and contains both a `*` and a `+`/`-`.
        paren_wide_operands (`tuple[int, int]`, defaults to `(3, 5)`):
            Inclusive range of the number of operands inside the wide span.
        max_attempts (`int`, defaults to `2000`):
            Resampling budget per expression before `generate_expression` gives up.
    """

    operator_weights: dict[str, float] = field(default_factory=lambda: {"+": 4.0, "-": 3.0, "*": 6.0})
    operand_digits: tuple[int, int] = (3, 7)
    num_operators: tuple[int, int] = (3, 10)
    max_result_digits: int = 16
    paren_local_prob: float = 0.55
    paren_max_pairs: int = 2
    paren_wide_prob: float = 0.22
    paren_wide_operands: tuple[int, int] = (3, 5)
    max_attempts: int = 2000

    def __post_init__(self) -> None:
        # Normalise containers coming from YAML (lists, OmegaConf-produced dicts) so configs compare
        # equal and the dataclass stays hashable-by-value in spirit.
        object.__setattr__(self, "operand_digits", tuple(int(x) for x in self.operand_digits))
        object.__setattr__(self, "num_operators", tuple(int(x) for x in self.num_operators))
        object.__setattr__(self, "paren_wide_operands", tuple(int(x) for x in self.paren_wide_operands))
        if not isinstance(self.operator_weights, Mapping):  # `operator_weights:` left empty in YAML
            raise ValueError(
                f"operator_weights must map '+', '-', '*' to weights, got {self.operator_weights!r}"
            )
        weights = {str(k): float(v) for k, v in self.operator_weights.items()}
        object.__setattr__(self, "operator_weights", weights)
        if set(weights) - {"+", "-", "*"} or any(w < 0 for w in weights.values()):
            raise ValueError(f"operator_weights must map '+', '-', '*' to weights >= 0, got {weights}")
        if sum(weights.values()) <= 0:
            raise ValueError("at least one operator weight must be positive")
        for name in ("operand_digits", "num_operators", "paren_wide_operands"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be an inclusive range [low, high] with 1 <= low <= high")
        if self.max_result_digits < 1 or self.max_attempts < 1 or self.paren_max_pairs < 0:
            raise ValueError("max_result_digits and max_attempts must be >= 1, paren_max_pairs >= 0")
        for name in ("paren_local_prob", "paren_wide_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability")


_CONFIG_FIELDS = {f.name for f in fields(ArithmeticConfig)}


def config_from_mapping(
    values: Mapping[str, Any], base: ArithmeticConfig | None = None, section: str = "ArithmeticConfig"
) -> ArithmeticConfig:
    """`base` (default: paper constants) with the fields in `values` replaced. An unknown key or a
    bad value raises a ValueError that starts with `section`, the mapping's params path (e.g.
    `arithmetic.profiles.tiny.tiers.hard`), so that the message says which entry to fix."""
    check_keys(section, values, _CONFIG_FIELDS)
    try:
        return replace(base or ArithmeticConfig(), **dict(values))
    except (TypeError, ValueError) as err:  # a value of the wrong type, a range or weight out of bounds
        raise ValueError(f"{section}: {err}") from err


def _random_operand(rng: random.Random, digits: tuple[int, int]) -> str:
    length = rng.randint(*digits)
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(length - 1))


def _inject_parentheses(
    ops: Sequence[str], config: ArithmeticConfig, rng: random.Random
) -> list[tuple[int, int]]:
    """Operand-index spans (inclusive) to wrap in parentheses; spans never overlap (no nesting)."""
    spans: list[tuple[int, int]] = []

    def free(span: tuple[int, int]) -> bool:
        return all(span[1] < lo or hi < span[0] for lo, hi in spans)

    # Local pairs: op i joins operands i and i+1; wrapping a +/- next to a * changes the value,
    # which is the point of the parentheses (they are what makes the problems hard to chunk).
    candidates = [
        i
        for i, op in enumerate(ops)
        if op in "+-" and ((i > 0 and ops[i - 1] == "*") or (i + 1 < len(ops) and ops[i + 1] == "*"))
    ]
    rng.shuffle(candidates)
    for i in candidates:
        if len(spans) >= config.paren_max_pairs:
            break
        if rng.random() < config.paren_local_prob and free((i, i + 1)):
            spans.append((i, i + 1))

    num_operands = len(ops) + 1
    if len(spans) < config.paren_max_pairs and rng.random() < config.paren_wide_prob:
        high = min(config.paren_wide_operands[1], num_operands)
        low = min(config.paren_wide_operands[0], high)
        if low >= 2:
            width = rng.randint(low, high)
            start = rng.randint(0, num_operands - width)
            span = (start, start + width - 1)
            inside = ops[start : start + width - 1]
            if free(span) and "*" in inside and ("+" in inside or "-" in inside):
                spans.append(span)
    return spans


def _render(operands: Sequence[str], ops: Sequence[str], spans: Iterable[tuple[int, int]]) -> str:
    opens = Counter(lo for lo, _ in spans)
    closes = Counter(hi for _, hi in spans)
    parts: list[str] = []
    for i, operand in enumerate(operands):
        parts.append("(" * opens[i] + operand + ")" * closes[i])
        if i < len(ops):
            parts.append(ops[i])
    return "".join(parts)


def generate_expression(config: ArithmeticConfig, rng: random.Random) -> tuple[str, int]:
    """One `(expression, value)` drawn from `config`, using only `rng` for randomness.

    Raises `RuntimeError` when `max_attempts` draws all exceed `max_result_digits`.
    """
    symbols = [op for op in ("+", "-", "*") if config.operator_weights.get(op, 0.0) > 0]
    weights = [config.operator_weights[op] for op in symbols]
    for _ in range(config.max_attempts):
        n_ops = rng.randint(*config.num_operators)
        operands = [_random_operand(rng, config.operand_digits) for _ in range(n_ops + 1)]
        ops = rng.choices(symbols, weights=weights, k=n_ops)
        spans = _inject_parentheses(ops, config, rng) if config.paren_max_pairs > 0 else []
        expr = _render(operands, ops, spans)
        value = evaluate_expression(expr)
        if len(str(abs(value))) <= config.max_result_digits:
            return expr, value
    raise RuntimeError(
        f"no expression within {config.max_result_digits} result digits after {config.max_attempts} "
        "attempts; lower the '*' weight or the operator count"
    )


# --------------------------------------------------------------------------- splits


def _derive_seed(seed: int, label: str) -> int:
    # Each tier gets its own stream, so adding a tier or changing one count leaves the others'
    # problems unchanged (the tiers' operator ranges are disjoint, `_check_tiers_disjoint`, so no
    # tier's draws are skipped as repeats of another's). sha256 (unlike hash()) does not depend on
    # PYTHONHASHSEED.
    digest = hashlib.sha256(f"{seed}/{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _record(expr: str, value: int, tier: str, split: str) -> dict[str, Any]:
    return {
        # Content-addressed id: stable across count changes and re-splits, joinable across runs.
        "id": "arith-" + hashlib.sha256(expr.encode()).hexdigest()[:16],
        "expr": expr,
        "prompt": arithmetic_prompt(expr),
        # A decimal string: Arrow's int64 cannot hold results above 19 digits, and QA/math golds
        # are strings too, so every task shares one schema. Use int(record["answer"]) to score.
        "answer": str(value),
        "num_operators": count_operators(expr),
        "num_operands": count_operators(expr) + 1,
        "tier": tier,
        "split": split,
    }


def _sample_unique(
    config: ArithmeticConfig, count: int, rng: random.Random, seen: set[str], label: str
) -> list[tuple[str, int]]:
    """`count` distinct expressions of `config` not in `seen`; `label` (the tier's params path) names
    the tier in every error."""
    out: list[tuple[str, int]] = []
    # Small tiers (1 operator, 1-2 digit operands) have only ~2e4 distinct problems; cap the draws
    # so an impossible count fails loudly instead of looping forever.
    budget = 20 * count + 1000
    while len(out) < count:
        budget -= 1
        if budget < 0:
            raise RuntimeError(f"{label}: could not draw {count} distinct expressions; lower the count")
        try:
            expr, value = generate_expression(config, rng)
        except RuntimeError as err:  # no expression within the result digits: which tier's settings
            raise RuntimeError(f"{label}: {err}") from err
        if expr not in seen:
            seen.add(expr)
            out.append((expr, value))
    return out


def _test_count(count: int, test_fraction: float) -> int:
    """Test problems of a tier of `count`. Python's round() rounds halves to even (round(0.5) == 0,
    round(2.5) == 2); it stays, because the committed splits were cut with it."""
    return round(test_fraction * count)


def _check_tier_split_sizes(
    tiers: Mapping[str, tuple[ArithmeticConfig, int]], test_fraction: float, where: str
) -> None:
    """Refuse a tier that `test_fraction` would leave with no test or no train problem.

    With round-half-to-even, 5 problems at 0.1 gave round(0.5) == 0 test problems: the test split
    silently had none of that tier. Every setting that gives each tier both splits is unchanged.
    """
    if test_fraction <= 0:  # test_fraction 0 asks for no test split: nothing to check
        return
    for tier, (_, count) in tiers.items():
        n_test = _test_count(count, test_fraction)
        if 0 < n_test < count:
            continue
        missing = "test" if n_test == 0 else "train"
        # The smallest count that gives the tier both splits (finite: 0 < test_fraction < 1).
        enough = next(c for c in range(count, 2**31) if 0 < _test_count(c, test_fraction) < c)
        change = "raise arithmetic.test_fraction" if missing == "test" else "lower arithmetic.test_fraction"
        raise ValueError(
            f"{where}.tiers.{tier}: count {count} at arithmetic.test_fraction {test_fraction} gives "
            f"{n_test} test and {count - n_test} train problems, so the {missing} split would have "
            f"no problem of this tier; raise the count to at least {enough} or {change}"
        )


def _check_tiers_disjoint(tiers: Mapping[str, tuple[ArithmeticConfig, int]], where: str) -> None:
    """Refuse two tiers whose `num_operators` ranges overlap.

    Expressions are unique across tiers: a tier skips every expression an earlier tier drew. When
    two tiers can draw expressions with the same operator count, one tier's count (and the order
    the tiers are listed in) would change the other's problems. An expression's operator count is
    fixed by its text, so tiers with disjoint ranges can never draw the same expression.
    """
    names = list(tiers)
    for i, first in enumerate(names):
        lo1, hi1 = tiers[first][0].num_operators
        for second in names[i + 1 :]:
            lo2, hi2 = tiers[second][0].num_operators
            if lo1 <= hi2 and lo2 <= hi1:
                raise ValueError(
                    f"{where}.tiers.{first} (num_operators [{lo1}, {hi1}]) and "
                    f"{where}.tiers.{second} (num_operators [{lo2}, {hi2}]) overlap: a later tier "
                    "skips the expressions an earlier one drew, so one tier's count would change "
                    "the other's problems; give the tiers disjoint num_operators ranges"
                )


DEFAULT_PROFILE = "tiny"
"""The arithmetic profile used when params name none."""


def _profile(params: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    name = params.get("profile", DEFAULT_PROFILE)
    profiles = params.get("profiles", {})
    if name not in profiles:
        raise ValueError(f"arithmetic.profile {name!r} not in arithmetic.profiles ({sorted(profiles)})")
    return name, profiles[name]


def build_arithmetic_splits(params: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Records for the splits `train`, `test`, `ood` and `rl` from the `arithmetic:` params section.

    `params` has `seed`, `test_fraction`, `profile` and `profiles.<name>` with `generator`
    (ArithmeticConfig fields; unset fields keep the paper constants), `tiers` (name ->
    `{num_operators: [lo, hi], count: n}`, optionally more ArithmeticConfig overrides), `ood`
    (the same shape, or null for no OOD split) and optionally `rl` (the same shape: problems for
    GRPO only, longer than every tier). The tier problems are split per tier into test
    (`round(test_fraction * count)`, Python's half-to-even rounding) and train; with
    `test_fraction > 0` every tier must get at least one problem of each, or a ValueError says
    which count to raise. Tiers' `num_operators` ranges must be disjoint; `rl` must use more
    operators than any tier, and `ood` strictly more than any tier and than `rl`, so that ood is
    longer than anything trained on. Expressions are unique across all splits, so test and ood
    never leak into train or rl.
    `rl` is drawn last, from its own seeded stream: adding it leaves the other splits' bytes as
    they were.
    """
    check_keys("arithmetic", params, ("seed", "test_fraction", "profile", "profiles"))
    seed = int(params["seed"])
    test_fraction = float(params.get("test_fraction", 0.1))
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError("test_fraction must be in [0, 1)")
    profile_name, profile = _profile(params)
    where = f"arithmetic.profiles.{profile_name}"
    check_keys(where, profile, ("generator", "tiers", "ood", "rl"))  # a misspelt `ood` gave no ood split
    base = config_from_mapping(profile.get("generator") or {}, section=f"{where}.generator")

    def tier_config(spec: Mapping[str, Any], section: str) -> tuple[ArithmeticConfig, int]:
        if not isinstance(spec, Mapping):
            raise ValueError(f"{section}: expected a mapping with `count` and generator fields, got {spec!r}")
        count = int_setting(spec.get("count"), f"{section}.count", minimum=1)
        overrides = {k: v for k, v in spec.items() if k != "count"}
        return config_from_mapping(overrides, base, section=section), count

    tiers = {
        name: tier_config(spec, f"{where}.tiers.{name}")
        for name, spec in (profile.get("tiers") or {}).items()
    }
    if not tiers:
        raise ValueError("the arithmetic profile defines no tiers")
    # Checked before any drawing: a bad setting fails at once, and a good one draws as before.
    _check_tiers_disjoint(tiers, where)
    _check_tier_split_sizes(tiers, test_fraction, where)
    ood_spec = profile.get("ood")
    ood = tier_config(ood_spec, f"{where}.ood") if ood_spec else None
    rl_spec = profile.get("rl")
    rl = tier_config(rl_spec, f"{where}.rl") if rl_spec else None
    longest_tier = max(cfg.num_operators[1] for cfg, _ in tiers.values())
    if rl is not None and rl[0].num_operators[0] <= longest_tier:
        raise ValueError(
            f"{where}.rl must use more operators than any tier: min {rl[0].num_operators[0]} "
            f"<= max tier {longest_tier}"
        )
    if ood is not None:
        if ood[0].num_operators[0] <= longest_tier:
            raise ValueError(
                f"ood must use more operators than any tier: min {ood[0].num_operators[0]} "
                f"<= max tier {longest_tier}"
            )
        if rl is not None and ood[0].num_operators[0] <= rl[0].num_operators[1]:
            raise ValueError(
                f"ood must use more operators than rl: min {ood[0].num_operators[0]} "
                f"<= max rl {rl[0].num_operators[1]}"
            )

    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    for tier, (cfg, count) in tiers.items():
        problems = _sample_unique(
            cfg, count, random.Random(_derive_seed(seed, f"tier/{tier}")), seen, f"{where}.tiers.{tier}"
        )
        n_test = _test_count(count, test_fraction)
        # The draws are not i.i.d. once repeats are rejected: a tier's rare shapes (the tiny
        # profile's 162 one-operator problems) come up early and run out, so the first n_test draws
        # held 27% one-operator problems against 3% in the rest. A seeded shuffle before the cut
        # makes test a uniform sample of the tier's problems, with the same mix as train.
        random.Random(_derive_seed(seed, f"split/{tier}")).shuffle(problems)
        for i, (expr, value) in enumerate(problems):
            split = "test" if i < n_test else "train"
            splits[split].append(_record(expr, value, tier, split))
    if ood is not None:
        cfg, count = ood
        problems = _sample_unique(cfg, count, random.Random(_derive_seed(seed, "ood")), seen, f"{where}.ood")
        splits["ood"] = [_record(expr, value, "ood", "ood") for expr, value in problems]
    if rl is not None:
        cfg, count = rl
        problems = _sample_unique(cfg, count, random.Random(_derive_seed(seed, "rl")), seen, f"{where}.rl")
        splits["rl"] = [_record(expr, value, "rl", "rl") for expr, value in problems]
    # Shuffle so that consumers reading in order (training loops, truncated evals) see a tier mix.
    for name in ("train", "test"):
        random.Random(_derive_seed(seed, f"shuffle/{name}")).shuffle(splits[name])
    return splits


# --------------------------------------------------------------------------- data card


def canonical_jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    """Canonical JSON lines (sorted keys, compact, UTF-8): the byte form hashed for the card."""
    return "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records
    )


def split_content_hash(records: Iterable[Mapping[str, Any]]) -> str:
    """sha256 of `canonical_jsonl(records)`: identical records in identical order, identical hash."""
    return hashlib.sha256(canonical_jsonl(records).encode("utf-8")).hexdigest()


def _histogram(values: Iterable[int]) -> dict[str, int]:
    # String keys, sorted numerically: JSON object keys are strings anyway, and DVC diffs stay tidy.
    counts = Counter(values)
    return {str(k): counts[k] for k in sorted(counts)}


def arithmetic_card(splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per-split counts, tier counts, operator-count and answer-digit histograms and content hashes."""
    card: dict[str, Any] = {"splits": {}}
    for name, records in splits.items():
        card["splits"][name] = {
            "count": len(records),
            "tiers": dict(sorted(Counter(r["tier"] for r in records).items())),
            "num_operators": _histogram(int(r["num_operators"]) for r in records),
            "answer_digits": _histogram(len(str(abs(int(r["answer"])))) for r in records),
            "negative_answers": sum(int(r["answer"]) < 0 for r in records),
            "sha256": split_content_hash(records),
        }
    card["total"] = sum(len(records) for records in splits.values())
    return card
