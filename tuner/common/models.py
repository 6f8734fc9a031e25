"""Models that need no download: a tiny random-weight Llama, and config-only real architectures.

A config-only folder is served with `--load-format dummy` (random weights of the real shape), so speed and
memory behave as for the real model while nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tuner.common.console import err
from tuner.common.errors import TunerError
from tuner.common.paths import default_tiny_model

TINY_VOCAB = 1024
TINY_MAX_POSITIONS = 4096

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelInfo:
    """What the launcher and the replayer need to know about a model folder."""

    path: Path
    architecture: str
    vocab_size: int
    max_position_embeddings: int
    has_weights: bool
    has_tokenizer: bool
    # Bytes of KV cache per token in the model's dtype: layers * 2 (K and V) * kv_heads * head_dim * 2 bytes.
    kv_bytes_per_token: int


def inspect_model(path: str | Path) -> ModelInfo:
    """Read a model folder's config.json; a clear error if it is not a model folder."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise TunerError(f"{folder}: not a model folder (no config.json)")
    try:
        config = json.loads(config_file.read_text())
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        layers = int(config["num_hidden_layers"])
        info = ModelInfo(
            path=folder,
            architecture=(config.get("architectures") or ["unknown"])[0],
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            has_weights=any(any(folder.glob(p)) for p in _WEIGHT_PATTERNS),
            has_tokenizer=any((folder / f).exists() for f in _TOKENIZER_FILES),
            kv_bytes_per_token=layers * 2 * kv_heads * head_dim * 2,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TunerError(f"{config_file}: not a usable model config ({exc.__class__.__name__}: {exc})") from None
    return info


def shipped_architectures() -> list[str]:
    """Names of the config-only real architectures that ship with tuner."""
    root = resources.files("tuner") / "model_configs"
    return sorted(entry.name for entry in root.iterdir() if (entry / "config.json").is_file())


def write_architecture(name: str, folder: str | Path) -> Path:
    """Write a shipped config-only architecture into `folder` (served with --load-format dummy)."""
    if name not in shipped_architectures():
        raise TunerError(f"unknown architecture {name!r}; shipped: {', '.join(shipped_architectures())}")
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    source = resources.files("tuner") / "model_configs" / name / "config.json"
    with resources.as_file(source) as src:
        shutil.copyfile(src, target / "config.json")
    return target


def _tokenizer_corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """A deterministic synthetic corpus, so the tokenizer is the same on every machine."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "ba", "do", "fe", "gi", "hu"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(3000)]
    punctuation = [".", ",", "?", "!", ";", ":"]
    return [
        " ".join(rng.choices(words, k=rng.randint(4, 20))) + rng.choice(punctuation) + f" {rng.randint(0, 9999)}"
        for _ in range(lines)
    ]


def default_model() -> Path:
    """The model used when none is named: the tiny one, written on first use (a few seconds)."""
    folder = default_tiny_model()
    if not (folder / "config.json").is_file():
        with err.status(f"writing the tiny model to {folder}"):
            write_tiny_model(folder)
    return folder


def write_tiny_model(folder: str | Path, seed: int = 0) -> Path:
    """A Llama-architecture model with random weights and a byte-level BPE tokenizer trained here (~5 MB)."""
    # Imported here: torch and transformers take seconds to import and most commands never need them.
    # lazy: keeps the CLI's start fast (torch, transformers)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_tokenizer_corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        model_max_length=TINY_MAX_POSITIONS
    )
    fast.save_pretrained(target)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    return target
