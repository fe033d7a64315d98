"""Shared fixtures: a real tokenizer and a tiny random model, written to disk once per session."""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer trained on protocol text plus a random tiny Qwen3 model, saved with save_pretrained."""
    from selfcest.model import TinyModelConfig, build_tiny_model
    from selfcest.tokenizer import train_tokenizer
    from selfcest.tokenizer_corpus import protocol_corpus

    path = tmp_path_factory.mktemp("tiny_checkpoint")
    tokenizer = train_tokenizer(protocol_corpus(seed=0, repeats=20), vocab_size=512)
    model = build_tiny_model(
        TinyModelConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=2048,
        ),
        tokenizer,
        seed=0,
    )
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_checkpoint: Path):
    from selfcest.tokenizer import load_tokenizer

    return load_tokenizer(tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path):
    from selfcest.model import load_model

    return load_model(tiny_checkpoint)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for the servers the tests start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real S3-compatible server (moto's) on loopback; credentials `testing` / `testing`, also in
    the environment."""
    pytest.importorskip("moto")
    from moto.server import ThreadedMotoServer

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # moto keeps its buckets in process-wide state, not per server: without a reset, a bucket that
    # an earlier test made would already exist here.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30)
    try:
        yield endpoint
    finally:
        server.stop()


# Property tests explore the same examples on every run, so CI results are reproducible.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("deterministic", derandomize=True, print_blob=True)
_hypothesis_settings.load_profile("deterministic")
