"""The paper profile overlay: applied with DVC's own `-S` code, every stage's config builds from it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from selfcest.cli import main as cli_main
from selfcest.profiles import ProfileError, leaves, load_profile, profile_overrides

REPO = Path(__file__).resolve().parent.parent
PAPER = REPO / "profiles" / "paper.yaml"


def _params() -> dict:
    return load_profile(REPO / "params.yaml")  # as `selfcest profile` reads it


def test_the_paper_profile_applies_through_dvc_and_every_stage_config_builds(tmp_path: Path, capsys) -> None:
    from selfcest.data.arithmetic import build_arithmetic_splits
    from selfcest.evaluation import MethodSpec, runtime_config_from_params
    from selfcest.grpo import TrainingConfig
    from selfcest.sweep_config import settings_for
    from stages.train_grpo import selfcest_config

    assert cli_main(["profile", str(PAPER), "--params", str(REPO / "params.yaml"), "--print0"]) == 0
    words = capsys.readouterr().out.split("\0")[:-1]
    assert words[0::2] == ["-S"] * (len(words) // 2)  # what `xargs -0 dvc exp run` receives
    merged = OmegaConf.create(_through_dvc(tmp_path, words[1::2]))
    for key, value in leaves(load_profile(PAPER)):
        assert OmegaConf.select(merged, key) == value, key
    params = OmegaConf.to_container(merged, resolve=True)

    # generate_arithmetic: the release's distribution (small counts: this checks the config only)
    arithmetic = dict(params["arithmetic"])
    arithmetic["profiles"]["paper"]["tiers"]["paper"]["count"] = 20
    arithmetic["profiles"]["paper"]["ood"]["count"] = 5
    splits = build_arithmetic_splits(arithmetic)
    assert {"train", "test", "ood"} <= set(splits) and any("*" in r["expr"] for r in splits["train"])
    # train_grpo, every variant
    grpo = params["grpo"]
    for variant in grpo["variants"]:
        training_runtime = selfcest_config(params, variant).runtime
    # Training episodes follow evaluation's protocol: what a clone's answer looks like to its root
    # (the tool message's cuts) and who may spawn (the depth). Were these left at RuntimeConfig's
    # defaults, RL would train on 32-token lines that the paper profile evaluates at 64.
    evaluation_runtime = runtime_config_from_params(params["runtime"])
    for protocol in ("max_depth", "tool_line_max_tokens", "tool_message_max_tokens"):
        assert getattr(training_runtime, protocol) == getattr(evaluation_runtime, protocol), protocol
    assert TrainingConfig(**grpo["training"]).learning_rate == pytest.approx(6e-7)
    # the evaluation cells and the report
    eval_params = params["eval"]
    assert runtime_config_from_params(params["runtime"]).max_clones_per_call == 30
    for methods in eval_params["models"].values():
        for name, values in methods.items():
            MethodSpec.from_params(name, values)
    for dataset in ("arithmetic", "qa", "math"):
        assert settings_for(eval_params, dataset).reference_budget in eval_params["budgets"][dataset]
    for split in eval_params["splits"]["math"]:
        assert (REPO / eval_params["math_sources"][split]["path"]).exists()
    real_qa = {source["name"] for source in params["qa"]["real"]["sources"]}
    assert set(eval_params["splits"]["qa"]) <= set(params["qa"]["synthetic"]["splits"]) | real_qa
    for benchmark in eval_params["report"]["claim_splits"]:
        dataset, split = benchmark.split("/")
        assert split in eval_params["splits"][dataset]


def test_overrides_refuse_unknown_keys_and_extra_values_win(tmp_path: Path, capsys) -> None:
    params = _params()
    overrides = profile_overrides(
        {"model": {"init_from": "/a b/it's"}, "eval": {"splits": {"qa": ["test", "ood"]}}},
        params,
        ["model.init_from=/models/q", "eval.sweep.max_problems=12"],
    )
    assert overrides == [
        "model.init_from='/models/q'",
        "eval.splits.qa=['test','ood']",
        "eval.sweep.max_problems=12",
    ]
    whole = profile_overrides(
        {"eval": {"report": {"reference_budget": {"qa": 1024, "math": 2048}}}},
        params,
        ["eval.report.reference_budget={qa: 64, arithmetic: 128, math: 256}"],
    )
    # a mapping merges leaf by leaf, as DVC merges it: the profile's other keys under it stay
    assert whole == [
        "eval.report.reference_budget.qa=64",
        "eval.report.reference_budget.math=256",
        "eval.report.reference_budget.arithmetic=128",
    ]
    quoted = profile_overrides({"model": {"init_from": "/a b/it's"}}, params)
    assert quoted == ["model.init_from='/a b/it\\'s'"]
    with pytest.raises(ProfileError, match="keys that params.yaml does not have: grpo.training.learning_rat"):
        profile_overrides({"grpo": {"training": {"learning_rat": 1e-6}}}, params)
    with pytest.raises(ProfileError, match="--set expects key=value"):
        profile_overrides({}, params, ["model.init_from"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"runtime": {"max_clone_per_call": 3}}), encoding="utf-8")
    assert cli_main(["profile", str(bad), "--params", str(REPO / "params.yaml")]) == 2
    assert "runtime.max_clone_per_call" in capsys.readouterr().err


def _through_dvc(tmp_path: Path, overrides: list[str], source: Path = REPO / "params.yaml") -> dict:
    """`source` (params.yaml) after `dvc exp run -S <overrides>`, read as DVC reads it (YAML 1.2)."""
    from dvc.utils.hydra import apply_overrides

    tmp_path.mkdir(parents=True, exist_ok=True)
    params_file = tmp_path / "params.yaml"
    shutil.copy(source, params_file)
    apply_overrides(params_file, overrides)
    return load_profile(params_file)


def test_set_values_mean_what_dvc_exp_run_s_makes_of_them(tmp_path: Path) -> None:
    params = _params()
    profile = {"grpo": {"runtime": {"max_clones_per_call": 30, "root_max_tokens": 4096}}}
    overrides = profile_overrides(
        profile,
        params,
        ["grpo.runtime={max_turns: 6}", "grpo.training.learning_rate=3e-05", "model.init_from='/m/run #2'"],
    )
    applied = _through_dvc(tmp_path, overrides)
    # the mapping set merges into the profile's runtime instead of dropping it back to the defaults
    assert applied["grpo"]["runtime"]["max_clones_per_call"] == 30
    assert applied["grpo"]["runtime"]["root_max_tokens"] == 4096
    assert applied["grpo"]["runtime"]["max_turns"] == 6
    assert applied["grpo"]["training"]["learning_rate"] == pytest.approx(3e-05)  # a float, not '3e-05'
    assert applied["model"]["init_from"] == "/m/run #2"
    assert profile_overrides({}, params, ["model.init_from=off"]) == ["model.init_from='off'"]
    with pytest.raises(ProfileError, match="--set 'grpo.training.learning_rate=\\[unclosed'"):
        profile_overrides({}, params, ["grpo.training.learning_rate=[unclosed"])
    with pytest.raises(ProfileError, match="a sweep"):
        profile_overrides({}, params, ["seed=1,2"])


def test_keys_a_dotted_override_cannot_spell_go_as_mappings_and_strings_round_trip(tmp_path: Path) -> None:
    params = _params()
    paths = ["C:\\models\\q", "ends\\", "it's", "a\\'b", "/a b/#2"]
    profile = {
        "eval": {"models": {"warmup_model": {"sc@4": {"temperature": 0.6}}}},
        "arithmetic": {"profiles": {"tiny": {"generator": {"operator_weights": {"*": 1}}}}},
    }
    overrides = profile_overrides(profile, params)
    assert overrides == [
        "eval.models.warmup_model={sc@4:{temperature:0.6}}",
        "arithmetic.profiles.tiny.generator.operator_weights={*:1}",
    ]
    # a --set under the same special-key mapping merges with the profile's, as DVC would apply both
    both = profile_overrides(profile, params, ["eval.models.warmup_model={sc@8: {samples: 6}}"])
    assert both[0] == "eval.models.warmup_model={sc@4:{temperature:0.6},sc@8:{samples:6}}"
    applied = _through_dvc(tmp_path, overrides)
    assert applied["eval"]["models"]["warmup_model"]["sc@4"] == {
        **params["eval"]["models"]["warmup_model"]["sc@4"],
        "temperature": 0.6,
    }
    assert (
        applied["eval"]["models"]["warmup_model"]["base"] == params["eval"]["models"]["warmup_model"]["base"]
    )
    assert applied["arithmetic"]["profiles"]["tiny"]["generator"]["operator_weights"] == {
        "+": 4,
        "-": 3,
        "*": 1,
    }
    for index, path in enumerate(paths):
        [override] = profile_overrides({"model": {"init_from": path}}, params)
        assert _through_dvc(tmp_path / str(index), [override])["model"]["init_from"] == path, override


def test_keys_inside_a_mapping_that_goes_as_one_value_are_checked_too() -> None:
    """`sc@4: {temprature: 0.6}` went out as one value, unchecked, and DVC then refused it with
    "Could not override 'eval.models.warmup_model'"; so did a split params.yaml's mapping lacks.
    A list's item (`eval.budgets.qa.0=32`) became the mapping {0: 32}, which DVC refuses too."""
    params = _params()
    typo = {"eval": {"models": {"warmup_model": {"sc@4": {"temprature": 0.6}}}}}
    with pytest.raises(ProfileError, match=r"does not have: eval.models.warmup_model.sc@4.temprature$"):
        profile_overrides(typo, params)
    smoke = load_profile(REPO / "profiles" / "smoke.yaml")
    with pytest.raises(ProfileError, match=r"does not have: eval.sweep.max_problems.qa.2wiki_dev$"):
        profile_overrides(smoke, params, ["eval.sweep.max_problems={qa: {2wiki_dev: 4}}"])
    # over the paper profile's `max_problems: null` the mapping replaces the value: any split goes
    assert profile_overrides(load_profile(PAPER), params, ["eval.sweep.max_problems={qa: {musique_dev: 10}}"])
    with pytest.raises(ProfileError, match=r"give the whole list"):
        profile_overrides({}, params, ["eval.budgets.qa.0=32"])


def test_profile_files_read_as_yaml_1_2_and_broken_ones_are_named(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "lr.yaml"
    profile.write_text(
        "grpo:\n  training:\n    learning_rate: 1e-6\nmodel:\n  init_from: no\n", encoding="utf-8"
    )
    assert profile_overrides(load_profile(profile), _params()) == [
        "grpo.training.learning_rate=1e-06",
        "model.init_from='no'",
    ]
    broken = tmp_path / "broken.yaml"
    broken.write_text("grpo: [unclosed\n", encoding="utf-8")
    assert cli_main(["profile", str(broken), "--params", str(REPO / "params.yaml")]) == 2
    assert f"{broken}: not valid YAML" in capsys.readouterr().err
    assert cli_main(["profile", str(PAPER), "--params", str(broken)]) == 2
    assert f"{broken}: not valid YAML" in capsys.readouterr().err
    assert cli_main(["profile", str(PAPER), "--set", "seed=[1"]) == 2
    assert "--set 'seed=[1'" in capsys.readouterr().err


def test_a_mapping_over_a_scalar_is_one_value_as_dvc_takes_it(tmp_path: Path) -> None:
    """`eval.sweep.max_problems` is a number or a mapping per dataset: over a number (a params.yaml
    that holds 48) a mapping set replaces it (DVC accepts it); over params.yaml's mapping it sets
    those keys and keeps the others, and a number replaces the mapping. New keys under a mapping that
    has keys are refused by both (under an empty one they are added: the next test)."""
    scalar = tmp_path / "scalar.yaml"
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    scalar.write_text(re.sub(r"(?m)^(    max_problems: ).*$", r"\g<1>48", text, count=1), encoding="utf-8")
    params = load_profile(scalar)
    assert params["eval"]["sweep"]["max_problems"] == 48
    wanted = {"arithmetic": 10, "qa": 20}
    for overrides in (
        profile_overrides({}, params, ["eval.sweep.max_problems={arithmetic: 10, qa: 20}"]),
        profile_overrides({"eval": {"sweep": {"max_problems": wanted}}}, params),
    ):
        assert overrides == ["eval.sweep.max_problems={arithmetic:10,qa:20}"]
        applied = _through_dvc(tmp_path / "dvc", overrides, source=scalar)
        assert applied["eval"]["sweep"]["max_problems"] == wanted
    params = _params()
    overrides = profile_overrides({}, params, ["eval.sweep.max_problems={arithmetic: 10, qa: 20}"])
    applied = _through_dvc(tmp_path / "dvc2", overrides)["eval"]["sweep"]["max_problems"]
    assert applied == {**params["eval"]["sweep"]["max_problems"], **wanted}
    overrides = profile_overrides({}, params, ["eval.sweep.max_problems=30"])
    assert _through_dvc(tmp_path / "dvc3", overrides)["eval"]["sweep"]["max_problems"] == 30
    with pytest.raises(ProfileError, match="eval.report.reference_budget.qa_ood"):
        profile_overrides({}, params, ["eval.report.reference_budget={qa_ood: 64}"])


def test_a_set_mapping_over_a_profiles_scalar_keeps_the_profiles_reset(tmp_path: Path, capsys) -> None:
    """The paper profile's `max_problems: null` ("every problem") was dropped when `--set` gave a
    mapping under the same key, so params.yaml's 48/200 came back for the datasets it did not name.
    DVC, given the profile's value and then the mapping, keeps only the mapping."""
    params = _params()
    overrides = profile_overrides(
        {"eval": {"sweep": {"max_problems": None}}}, params, ["eval.sweep.max_problems={qa: 10}"]
    )
    assert overrides == ["eval.sweep.max_problems=null", "eval.sweep.max_problems={qa:10}"]
    assert _through_dvc(tmp_path / "dvc", overrides)["eval"]["sweep"]["max_problems"] == {"qa": 10}
    other = tmp_path / "other_params.yaml"
    other.write_text((REPO / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"runtime": {"max_clone_per_call": 3}}), encoding="utf-8")
    assert cli_main(["profile", str(bad), "--params", str(other)]) == 2
    assert f"keys that {other} does not have: runtime.max_clone_per_call" in capsys.readouterr().err


def test_a_reset_is_emitted_only_where_dvc_needs_and_takes_it(tmp_path: Path) -> None:
    """A `--set` mapping over a profile's scalar resets that scalar first only for a key params.yaml
    has and that no other override carries whole: inside a mapping that goes as one value, under a
    key params.yaml lacks, or under another reset, a reset would be refused by DVC (or by us)."""
    scalar = tmp_path / "scalar.yaml"
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    scalar.write_text(re.sub(r"(?m)^(    max_problems: ).*$", r"\g<1>48", text, count=1), encoding="utf-8")
    # params.yaml's 48: the profile's mapping is one value, and the --set merges into it
    overrides = profile_overrides(
        {"eval": {"sweep": {"max_problems": {"arithmetic": 10, "qa": 20}}}},
        load_profile(scalar),
        ["eval.sweep.max_problems.qa={test: 5}"],
    )
    assert overrides == ["eval.sweep.max_problems={arithmetic:10,qa:{test:5}}"]
    applied = _through_dvc(tmp_path / "scalar", overrides, source=scalar)
    assert applied["eval"]["sweep"]["max_problems"] == {"arithmetic": 10, "qa": {"test": 5}}
    params = _params()
    # a new key under an open mapping: nothing to reset, and the mapping is added with its `+`
    overrides = profile_overrides(
        {"eval": {"sweep": {"vllm": {"gpu_memory_utilization": 0.5}}}},
        params,
        ["eval.sweep.vllm.gpu_memory_utilization={a: 1}"],
    )
    assert overrides == ["+eval.sweep.vllm.gpu_memory_utilization={a:1}"]
    applied = _through_dvc(tmp_path / "open", overrides)
    assert applied["eval"]["sweep"]["vllm"] == {"gpu_memory_utilization": {"a": 1}}
    # a reset under another reset: the outer key's mapping carries it
    overrides = profile_overrides(
        {"eval": {"sweep": {"max_problems": None}}},
        params,
        ["eval.sweep.max_problems={qa: 10}", "eval.sweep.max_problems.qa={test: 5}"],
    )
    assert overrides == ["eval.sweep.max_problems=null", "eval.sweep.max_problems={qa:{test:5}}"]
    applied = _through_dvc(tmp_path / "nested", overrides)
    assert applied["eval"]["sweep"]["max_problems"] == {"qa": {"test": 5}}
    # the resets that are needed stay
    overrides = profile_overrides(
        {"grpo": {"gate_options": None}}, params, ["grpo.gate_options={ratio_clamp: 2.0}"]
    )
    assert overrides == ["grpo.gate_options=null", "grpo.gate_options={ratio_clamp:2.0}"]
    assert _through_dvc(tmp_path / "gate", overrides)["grpo"]["gate_options"] == {"ratio_clamp": 2.0}


def test_a_set_key_may_carry_dvcs_plus(tmp_path: Path) -> None:
    """`--set +key=value`, as `dvc exp run -S` spells a new key: the `+` goes where DVC needs it,
    and a key params.yaml does not have is refused as without it."""
    params = _params()
    overrides = profile_overrides({}, params, ["+eval.sweep.vllm.enforce_eager=true", "+seed=3"])
    assert overrides == ["+eval.sweep.vllm.enforce_eager=true", "seed=3"]
    applied = _through_dvc(tmp_path, overrides)
    assert applied["eval"]["sweep"]["vllm"] == {"enforce_eager": True} and applied["seed"] == 3
    with pytest.raises(ProfileError, match="does not have: eval.sweep.vlm$"):
        profile_overrides({}, params, ["+eval.sweep.vlm.enforce_eager=true"])
    with pytest.raises(ProfileError, match="--set '~seed=1': only key=value or \\+key=value"):
        profile_overrides({}, params, ["~seed=1"])


def test_files_that_are_not_utf_8_are_named(tmp_path: Path, capsys) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes('model:\n  init_from: "caf\xe9"\n'.encode("latin-1"))
    assert cli_main(["profile", str(latin), "--params", str(REPO / "params.yaml")]) == 2
    assert f"{latin}: not UTF-8 text" in capsys.readouterr().err
    assert cli_main(["profile", str(PAPER), "--params", str(latin)]) == 2
    assert f"{latin}: not UTF-8 text" in capsys.readouterr().err


def test_keys_under_the_mappings_params_yaml_leaves_empty_are_added_as_dvc_adds_them(tmp_path: Path) -> None:
    """`eval.sweep.vllm` and `grpo.gate_options` are `{}` in params.yaml, for keyword arguments: a key
    under them is new, so it goes to DVC as `+key=value`; a typo elsewhere is still refused."""
    params = _params()
    overrides = profile_overrides(
        {"grpo": {"gate_options": {"ratio_clamp": 2.0}}},
        params,
        ["eval.sweep.vllm={gpu_memory_utilization: 0.5, enforce_eager: true}"],
    )
    assert overrides == [
        "+grpo.gate_options.ratio_clamp=2.0",
        "+eval.sweep.vllm.gpu_memory_utilization=0.5",
        "+eval.sweep.vllm.enforce_eager=true",
    ]
    applied = _through_dvc(tmp_path, overrides)
    assert applied["grpo"]["gate_options"] == {"ratio_clamp": 2.0}
    assert applied["eval"]["sweep"]["vllm"] == {"gpu_memory_utilization": 0.5, "enforce_eager": True}
    with pytest.raises(ProfileError, match="does not have: eval.sweep.vlm$"):
        profile_overrides({"eval": {"sweep": {"vlm": {"gpu_memory_utilization": 0.5}}}}, params)


def test_grpo_gate_options_null_means_no_options() -> None:
    """A user who writes `gate_options: null` (YAML's "none") gets the gate's defaults, as with `{}`."""
    from selfcest.rewards import GateConfig
    from stages.train_grpo import selfcest_config

    params = _params()
    params["grpo"]["gate_options"] = None
    for name, variant in params["grpo"]["variants"].items():
        assert selfcest_config(params, name).gate == GateConfig(mode=variant["gate"])


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        # `protocl` trained as the ratio gate (clone_gate's fall-through), whose 192-token threshold
        # the tiny profile's 96-token clones never reach: the ungated ablation under the method's name
        (
            "variants.selfcest.gate",
            "protocl",
            r"grpo.variants.selfcest.gate must be one of none, protocol, ratio",
        ),
        ("clone_weighting", "groups", r"grpo.clone_weighting must be one of token, group, got 'groups'"),
        ("training.advantage", "means", r"grpo.training.advantage must be one of std, mean, got 'means'"),
        (
            "variants.selfcest.temperature",
            0.3,
            r"grpo.variants.selfcest takes use_tools and gate only; unknown",
        ),
    ],
)
def test_grpo_settings_that_would_train_as_another_are_refused_by_name(setting, value, message) -> None:
    from stages.train_grpo import selfcest_config

    params = _params()
    *path, key = ["grpo", *setting.split(".")]
    node = params
    for part in path:
        node = node[part]
    node[key] = value
    with pytest.raises(ValueError, match=message):
        selfcest_config(params, "selfcest")


def test_grpo_variant_missing_or_incomplete_names_the_setting() -> None:
    from stages.train_grpo import selfcest_config

    params = _params()
    with pytest.raises(
        ValueError, match=r"grpo.variants has no 'slefcest': it has selfcest, selfcest_nogate"
    ):
        selfcest_config(params, "slefcest")
    del params["grpo"]["variants"]["noclone"]["gate"]
    with pytest.raises(
        ValueError, match=r"grpo.variants.noclone takes use_tools and gate only; missing: \['gate'\]"
    ):
        selfcest_config(params, "noclone")


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    """`selfcest profile ... | head` printed a BrokenPipeError traceback once head had read enough."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "selfcest.cli", "profile", str(PAPER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before it writes: its first write finds no reader
    errors = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert "Traceback" not in errors, errors


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda text: text.replace("seed: 42", "seed: -1", 1), "seed"),
        (lambda text: text.replace("seed: 42", "seed: 4.5", 1), "seed"),
        (lambda text: text.replace("qa:\n  seed: ${seed}", "qa:\n  seed: -3", 1), "qa.seed"),
    ],
)
def test_every_stage_refuses_a_seed_that_is_not_a_non_negative_integer(tmp_path: Path, edit, where) -> None:  # noqa: ANN001
    """A negative seed used to pass the data stages and the warm-up and stop at the first sampled
    generation (numpy's SeedSequence refuses it); the stages' params reader now names it at once."""
    from stages.common import load_params

    params = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text()
    params.write_text(edit(text))
    assert params.read_text() != text
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(params))}: {re.escape(where)}: expected an integer >= 0"
    ):
        load_params(params)
    assert load_params(REPO / "params.yaml")["seed"] == 42
