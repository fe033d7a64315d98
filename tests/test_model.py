"""Tokenizer, tiny model, build_model stage and the `selfcest solve` CLI, all offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from selfcest.cli import main as cli_main
from selfcest.model import load_model
from selfcest.prompts import SPAWN_CLONE_TOOL, root_messages
from selfcest.tokenizer import IM_END, load_tokenizer


def test_tokenizer_round_trips_and_splits_digits(tiny_tokenizer) -> None:
    for text in ["Calculate the value of 12+7-3.", "Answer: -1234567", "Ünïcödé ✓ 日本", '{"task": "x"}']:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == text
    pieces = tiny_tokenizer.tokenize("98765")
    assert [tiny_tokenizer.convert_tokens_to_string([p]) for p in pieces] == list("98765")
    assert tiny_tokenizer.eos_token == IM_END
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id


def test_tokenizer_keeps_frequent_names_whole_wherever_they_stand() -> None:
    """A frequent name is one token at a sentence start, after a space and inside JSON (copyable)."""
    from selfcest.tokenizer import train_tokenizer

    corpus = ['Tolo works for Bari. Rasu lives in Tolo. In which city is Tolo based? ["Tolo", "Rasu"]'] * 200
    tokenizer = train_tokenizer(corpus, vocab_size=400)

    def pieces(text: str) -> list[str]:
        return [tokenizer.convert_tokens_to_string([p]) for p in tokenizer.tokenize(text)]

    assert pieces("Tolo met Rasu")[0] == "Tolo" and pieces("Tolo met Rasu")[-1] == "Rasu"
    assert "Tolo" in pieces('["Tolo"]') and "Rasu" in pieces("lives in Rasu.")
    # lower-case boilerplate still merges across spaces, but never into a name
    assert " works for " in pieces("Tolo works for Bari")
    for text in ["Independently Tolomira went", "Bari.", "TOLO and tolo"]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tokenizer_merges_the_qa_call_boilerplate_that_follows_the_tool_tag() -> None:
    """Merges are learned as encoding will apply them: after `<tool_call>` is cut out as an added token.

    Trained on the raw text, BPE merged across the tag, and the JSON that opens a QA call stayed in
    five pieces however often the corpus repeated it."""
    from selfcest.tokenizer import train_tokenizer
    from selfcest.tokenizer_corpus import protocol_corpus

    hops = [("Tolo", "Who founded Tolo?"), ("Rasu", "In which city was Rasu born?")]
    tokenizer = train_tokenizer(protocol_corpus(seed=0, repeats=50, qa_hops=hops), vocab_size=1500)
    call = (
        '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"context": ["Tolo"], '
        '"task": "Who founded Tolo?", "max_tokens": 32}]}}\n</tool_call>'
    )
    pieces = [tokenizer.convert_tokens_to_string([p]) for p in tokenizer.tokenize(call)]
    assert pieces[:3] == [
        "<tool_call>",
        '\n{"name": "spawn_clone", "arguments": {"objectives": [{"context": ["',
        "Tolo",
    ]
    assert '"], "task": "' in pieces and pieces[-1] == "</tool_call>"
    assert tokenizer.decode(tokenizer.encode(call, add_special_tokens=False)) == call


def test_chat_template_renders_hermes_tools_and_marks_assistant_tokens(tiny_tokenizer) -> None:
    call = (
        '<tool_call>\n{"name": "spawn_clone", "arguments": {"objectives": [{"task": "1+2"}]}}\n</tool_call>'
    )
    messages = [
        *root_messages("Calculate the value of 1+2."),
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "turn1_clone0: 3"},
        {"role": "assistant", "content": "Answer: 3"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tools=[SPAWN_CLONE_TOOL], tokenize=False)
    assert "<tools>\n" + json.dumps(SPAWN_CLONE_TOOL) + "\n</tools>" in text
    assert "<|im_start|>user\n<tool_response>\nturn1_clone0: 3\n</tool_response><|im_end|>" in text
    out = tiny_tokenizer.apply_chat_template(
        messages, tools=[SPAWN_CLONE_TOOL], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = tiny_tokenizer.decode(
        [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    )
    assert trained == call + "<|im_end|>" + "Answer: 3<|im_end|>"
    # tool tags survive skip_special_tokens (the parser reads decoded text)
    ids = tiny_tokenizer.encode(call, add_special_tokens=False)
    assert "<tool_call>" in tiny_tokenizer.decode(ids, skip_special_tokens=True)


def test_model_saves_and_loads_offline(tiny_checkpoint: Path, tmp_path: Path) -> None:
    model = load_model(tiny_checkpoint, dtype=torch.float32)
    assert model.config.model_type == "qwen3"
    model.save_pretrained(tmp_path / "copy")
    again = load_model(tmp_path / "copy", dtype=torch.float32)
    x = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(input_ids=x).logits, again(input_ids=x).logits)
    assert (tmp_path / "copy" / "model.safetensors").exists()


def test_position_encoding_none_leaves_queries_and_keys_unrotated(tiny_tokenizer, tmp_path: Path) -> None:
    from selfcest.model import TinyModelConfig, build_tiny_model

    build_tiny_model(TinyModelConfig(position_encoding="none"), tiny_tokenizer, seed=0).save_pretrained(
        tmp_path
    )
    model = load_model(tmp_path)  # the saved config alone must rebuild the same position scheme
    positions = torch.arange(1024)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1, 1024, 32), positions)
    assert torch.all(cos == 1.0) and sin.abs().max() < 1e-5
    rope = build_tiny_model(TinyModelConfig(), tiny_tokenizer, seed=0)
    cos, sin = rope.model.rotary_emb(torch.zeros(1, 1024, 32), positions)
    assert sin.abs().max() > 0.5  # the default still rotates
    with pytest.raises(ValueError, match="position_encoding"):
        build_tiny_model(TinyModelConfig(position_encoding="alibi"), tiny_tokenizer, seed=0)


def test_build_model_stage(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"prompt": f"Calculate the value of {i}+{i * 3}."}) for i in range(50))
    )
    params = tmp_path / "params.yaml"
    params.write_text(
        "seed: 1\ntokenizer: {vocab_size: 400, min_frequency: 2, corpus_files: [" + str(corpus) + "]}\n"
        "model: {init_from: null, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2,"
        " num_key_value_heads: 1, head_dim: 16, max_position_embeddings: 256, rope_theta: 10000.0, tie_word_embeddings: true}\n"
    )
    out, report = tmp_path / "model", tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "stages.build_model",
        "--params",
        str(params),
        "--out",
        str(out),
        "--report",
        str(report),
    ]
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1], capture_output=True)
    first = json.loads(report.read_text())
    assert first["vocab_size"] <= 420 and first["parameters"] > 0
    tokenizer = load_tokenizer(out)
    assert (
        tokenizer.decode(tokenizer.encode("Calculate the value of 3+9.", add_special_tokens=False))
        == "Calculate the value of 3+9."
    )
    weights = (out / "model.safetensors").read_bytes()
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1], capture_output=True)
    assert (out / "model.safetensors").read_bytes() == weights  # same seed, same weights
    assert json.loads(report.read_text()) == first


def test_cli_solve_prints_answer_tokens_and_tree(tiny_checkpoint: Path, capsys) -> None:
    assert (
        cli_main(
            [
                "solve",
                "--model",
                str(tiny_checkpoint),
                "--budget",
                "40",
                "--root-max-tokens",
                "20",
                "Calculate the value of 1+2.",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("answer: ")
    assert "generated=" in out and "critical_path=" in out and "budget=40" in out
    assert "root [" in out
    # the root's budget is the episode's; each of its turns is capped apart
    assert "budget=40 turn_max_tokens=20" in out
    assert (
        cli_main(["solve", "--model", str(tiny_checkpoint), "--json", "--no-tools", "--budget", "8", "hi"])
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["mode"] == "monolithic" and record["generated_tokens"] <= 8


def test_cli_solve_without_tools_may_spend_the_whole_budget_as_base_does(
    tiny_checkpoint: Path, capsys
) -> None:
    """`--no-tools` capped the model at the delegating root's 160 tokens whatever `--budget` said;
    the evaluation's `base` gets the whole budget (the random tiny model never stops early)."""
    args = ["solve", "--model", str(tiny_checkpoint), "--json", "--no-tools", "--budget", "200", "hi"]
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["generated_tokens"] > 160
    assert cli_main([*args, "--root-max-tokens", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["generated_tokens"] <= 20


def test_cli_solve_names_a_bad_model_path_or_documents_file(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    missing = tmp_path / "selfcest_modelx"
    assert cli_main(["solve", "--model", str(missing), "hi"]) == 2
    assert f"--model {missing}: no such checkpoint directory" in capsys.readouterr().err
    not_a_checkpoint = tmp_path / "models"
    not_a_checkpoint.mkdir()
    (not_a_checkpoint / "README.md").write_text("checkpoints go here\n", encoding="utf-8")
    assert cli_main(["solve", "--model", str(not_a_checkpoint), "hi"]) == 2
    error = capsys.readouterr().err
    assert (
        f"--model {not_a_checkpoint}: not a checkpoint directory (no config.json; no tokenizer file: "
        in error
    )
    cases = {
        "broken.json": ('{"a": "x",', "Expecting"),
        "numbers.json": ('{"a": 1}', "the paragraph of key 'a' is not text"),
        "list.json": ('["a"]', "must hold a JSON object"),
    }
    for name, (text, message) in cases.items():
        documents = tmp_path / name
        documents.write_text(text, encoding="utf-8")
        assert cli_main(["solve", "--model", str(tiny_checkpoint), "--documents", str(documents), "hi"]) == 2
        error = capsys.readouterr().err
        assert str(documents) in error and message in error, error
    absent = tmp_path / "absent.json"
    assert cli_main(["solve", "--model", str(tiny_checkpoint), "--documents", str(absent), "hi"]) == 2
    assert f"--documents {absent}" in capsys.readouterr().err
    latin = tmp_path / "latin.json"  # not UTF-8: a UnicodeDecodeError traceback before
    latin.write_bytes('{"a": "caf\u00e9"}'.encode("latin-1"))
    assert cli_main(["solve", "--model", str(tiny_checkpoint), "--documents", str(latin), "hi"]) == 2
    assert f"--documents {latin}: 'utf-8' codec can't decode" in capsys.readouterr().err


def test_cli_solve_refuses_counts_below_their_minimum_and_unknown_devices(
    tiny_checkpoint: Path, capsys
) -> None:
    """`--budget -5` stopped on "episode cli overran its budget" (an assertion), and `--device auto`,
    the pipeline's own default, or a GPU the machine lacks, failed deep in torch."""
    import torch

    for flag, value in [
        ("--budget", "-5"),
        ("--budget", "0"),
        ("--clone-max-tokens", "0"),
        ("--max-depth", "-1"),
    ]:
        with pytest.raises(SystemExit) as usage:
            cli_main(["solve", "--model", str(tiny_checkpoint), flag, value, "Calculate the value of 1+2."])
        assert usage.value.code == 2
        assert f"argument {flag}: expected a whole number >= " in capsys.readouterr().err
    assert cli_main(["solve", "--model", str(tiny_checkpoint), "--device", "gpu0", "hi"]) == 2
    assert "error: --device gpu0: " in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli_main(["solve", "--model", str(tiny_checkpoint), "--device", "cuda", "hi"]) == 2
        assert "this machine has no CUDA GPU" in capsys.readouterr().err
    question = "Calculate the value of 1+2."
    assert (
        cli_main(["solve", "--model", str(tiny_checkpoint), "--device", "auto", "--budget", "32", question])
        == 0
    )


def test_cli_solve_hands_halves_of_a_sum_by_key_as_the_pipeline_does(
    tiny_checkpoint: Path, monkeypatch, capsys
) -> None:
    """The committed checkpoints delegate sums by `first half` / `second half` (params.yaml's
    `runtime.expression_halves: true`); `selfcest solve` without halves refused both keys, so every
    clone failed and the root answered wrong (`selfcest_model` on README's own example)."""
    from scripted_policies import halving_policy

    import selfcest.engine
    from selfcest.scripted import ScriptedEngine

    monkeypatch.setattr(
        selfcest.engine,
        "TransformersEngine",
        lambda model, tokenizer: ScriptedEngine(tokenizer, halving_policy),
    )
    question = "Calculate the value of 1+2+3+4+5+6+7+8."
    assert cli_main(["solve", "--model", str(tiny_checkpoint), "--json", question]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["final_answer"] == "36" and record["protocol_errors"] == [] and record["num_clones"] == 2
    assert cli_main(["solve", "--model", str(tiny_checkpoint), "--json", "--no-halves", question]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {error["kind"] for error in record["protocol_errors"]} == {"unknown_context_key"}


def test_cli_solve_shows_the_documents_to_the_monolithic_model(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    """`--documents` with `--no-tools`: the monolithic reader sees every paragraph in its prompt, as
    the `base` method does; they were dropped, so it answered from the question alone."""
    documents = tmp_path / "documents.json"
    documents.write_text(json.dumps({"Neri": "Neri is led by Nope.", "Nope": "Nope was born in Mino."}))
    argv = [
        "solve",
        "--model",
        str(tiny_checkpoint),
        "--json",
        "--budget",
        "4",
        "--documents",
        str(documents),
    ]
    assert cli_main([*argv, "--no-tools", "In which city was the head of Neri born?"]) == 0
    [root] = json.loads(capsys.readouterr().out)["agents"]
    prompt = load_tokenizer(tiny_checkpoint).decode(root["token_ids"])
    assert "[Neri] Neri is led by Nope." in prompt and "[Nope] Nope was born in Mino." in prompt
    assert cli_main([*argv, "In which city was the head of Neri born?"]) == 0
    root = json.loads(capsys.readouterr().out)["agents"][0]
    prompt = load_tokenizer(tiny_checkpoint).decode(root["token_ids"])
    assert "Documents: Neri, Nope" in prompt and "Mino" not in prompt  # the delegating root: keys only


def test_checkpoint_hashes_cover_sharded_weights_and_the_tokenizer_files(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """A Hugging Face checkpoint of billions of parameters ships in shards: the run fingerprints
    must hash it (not look for one `model.safetensors`), and a changed chat template with the same
    weights must give another fingerprint, so that a killed run never resumes across it."""
    import shutil

    from selfcest.checkpoints import checkpoint_sha256s, weights_sha256
    from selfcest.hashing import file_sha256

    single = checkpoint_sha256s(tiny_checkpoint)
    assert single["weights"] == file_sha256(tiny_checkpoint / "model.safetensors")
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(single)

    sharded = tmp_path / "sharded"
    load_model(tiny_checkpoint).save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    digest = weights_sha256(sharded)
    assert digest is not None and digest != single["weights"]
    (sharded / shards[0].name).write_bytes(shards[0].read_bytes() + b" ")
    assert weights_sha256(sharded) != digest  # every shard counts
    assert weights_sha256(tmp_path) is None  # no weights at all

    copy = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint, copy)
    assert checkpoint_sha256s(copy) == single
    template = copy / "chat_template.jinja"
    template.write_text(
        (template.read_text(encoding="utf-8") if template.exists() else "") + "{# fixed #}", encoding="utf-8"
    )
    changed = checkpoint_sha256s(copy)
    assert changed["weights"] == single["weights"] and changed != single
    # the model's configuration changes what the same weights generate: another starting point too
    config = copy / "config.json"
    config.write_text(config.read_text(encoding="utf-8").replace('"rope_theta"', '"rope_theta_"'), "utf-8")
    assert checkpoint_sha256s(copy)["weights"] == single["weights"] and checkpoint_sha256s(copy) != changed
    # files the tokenizer also reads: swapped end and padding tokens, a tool-use template, a Qwen
    # checkpoint's BPE vocabulary and merges (another tokenizer with the same weights)
    for extra in (
        "special_tokens_map.json",
        "additional_chat_templates/tool_use.jinja",
        "vocab.json",
        "merges.txt",
    ):
        before = checkpoint_sha256s(copy)
        (copy / extra).parent.mkdir(exist_ok=True)
        (copy / extra).write_text('{"eos_token": "<|endoftext|>"}', encoding="utf-8")
        assert checkpoint_sha256s(copy) != before, extra


def test_chat_template_renders_a_system_message_after_the_first_as_its_own_turn(tiny_tokenizer) -> None:
    """As Qwen3's template does; it had been dropped without a trace."""
    messages = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "system", "content": "MID NOTE"},
        {"role": "user", "content": "Q2"},
    ]
    text = tiny_tokenizer.apply_chat_template(
        messages, tools=[SPAWN_CLONE_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>system\nMID NOTE<|im_end|>\n<|im_start|>user\nQ2" in text
    assert text.count("SYS") == 1  # the first system message still heads the tools block, once


@pytest.mark.parametrize("tools", [None, [SPAWN_CLONE_TOOL]])
def test_chat_template_renders_none_content_as_empty_text(tiny_tokenizer, tools) -> None:
    """OpenAI-style messages may carry `content: None` (Qwen3's template renders ''); it had raised."""

    def render(content: str | None) -> str:
        messages = [
            {"role": "system", "content": content},
            {"role": "user", "content": content},
            {"role": "assistant", "content": content},
            {"role": "tool", "content": content},
        ]
        return tiny_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)

    assert render(None) == render("")
    assert "<tool_response>\n\n</tool_response>" in render(None)


def test_build_model_names_a_starting_checkpoint_dvc_would_not_track(tmp_path: Path) -> None:
    """`models/` is build_model's DVC dependency: a checkpoint there is tracked; one elsewhere, or one
    reached through a linked folder (DVC does not follow it), is named with the reason."""
    from stages.build_model import untracked_checkpoint_reason

    tracked = tmp_path / "models"
    (tracked / "qwen").mkdir(parents=True)
    outside = tmp_path / "elsewhere" / "qwen"
    outside.mkdir(parents=True)
    (tracked / "linked").symlink_to(outside, target_is_directory=True)
    assert untracked_checkpoint_reason(tracked / "qwen", tracked) is None
    assert "outside" in untracked_checkpoint_reason(outside, tracked)
    assert "outside" in untracked_checkpoint_reason(tmp_path / "models-old" / "qwen", tracked)
    assert "symbolic link" in untracked_checkpoint_reason(tracked / "linked", tracked)
    assert "symbolic link" in untracked_checkpoint_reason(tracked / "linked" / "sub", tracked)


def test_build_model_stage_copies_a_starting_checkpoint_and_warns_when_dvc_would_not_track_it(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(f"seed: 1\ntokenizer: {{}}\nmodel: {{init_from: {tiny_checkpoint}}}\n")
    out, report = tmp_path / "model", tmp_path / "report.json"
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "stages.build_model", "--params", str(params), "--out", str(out)]
    done = subprocess.run(
        [*cmd, "--report", str(report)], check=True, cwd=root, capture_output=True, text=True
    )
    assert (out / "model.safetensors").read_bytes() == (tiny_checkpoint / "model.safetensors").read_bytes()
    assert json.loads(report.read_text())["init_from"] == str(tiny_checkpoint)
    assert f"model.init_from {tiny_checkpoint}: it is outside models/" in done.stderr


def test_cli_solve_pins_the_pipelines_cpu_kernels_before_torch(tmp_path: Path) -> None:
    """`selfcest solve` sets ATen's kernel level before torch is imported, as the stages do, so a
    checkpoint answers as in its evaluation cells (on an AVX-512 machine torch would else pick AVX-512)."""
    import os
    import subprocess
    import sys

    from selfcest.determinism import KERNEL_VARIABLE, OPT_OUT_VARIABLE, cpu_flags, pin_cpu_kernels

    expected = pin_cpu_kernels({}, cpu_flags())
    if expected is None:
        pytest.skip("this CPU has no AVX2 and FMA: nothing is pinned")
    script = (
        "import os, sys\n"
        "from selfcest.cli import main\n"
        f"main(['solve', '--model', {str(tmp_path / 'absent')!r}, 'hi'])\n"
        "import torch\n"
        f"print(os.environ.get({KERNEL_VARIABLE!r}), torch.backends.cpu.get_cpu_capability())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (KERNEL_VARIABLE, OPT_OUT_VARIABLE)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected, expected.upper()], out.stdout + out.stderr


def test_build_model_names_the_file_line_and_field_of_a_bad_corpus_record(tmp_path: Path) -> None:
    """The tokenizer corpus reader called json.loads and hop["paragraph_key"] bare: a broken second
    line said "line 1 column 18" (of the string) and a bad hop gave KeyError/TypeError with no file."""
    from stages.build_model import read_corpus_files

    good = '{"id": "q1", "question": "Who?", "hops": [{"paragraph_key": "k", "question": "Who?"}]}\n'
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good + '{"id": "q2",}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken.jsonl, line 2: not a JSON record"):
        read_corpus_files([str(broken)])
    for name, hop in [("missing", {"question": "Who?"}), ("listed", ["k", "Who?"])]:
        bad = tmp_path / f"{name}.jsonl"
        bad.write_text(
            good + "\n" + json.dumps({"id": "q3", "hops": [{"paragraph_key": "k", "question": "?"}, hop]})
        )
        with pytest.raises(
            ValueError, match=rf"{name}.jsonl, line 3 \(record 'q3'\): hops\[1\] needs 'paragraph_key'"
        ):
            read_corpus_files([str(bad)])
    fine = tmp_path / "fine.jsonl"
    fine.write_text(good + "\n" + good, encoding="utf-8")  # a blank line is no record
    strings, hops = read_corpus_files([str(fine)])
    assert hops == [("k", "Who?")] * 2 and strings.count("Who?") == 4
