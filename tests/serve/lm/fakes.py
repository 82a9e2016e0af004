"""A language model without a graph: a word-level tokenizer and a decoder whose logits are a
function of what its attention would see, so that wrong padding, masks or positions in a
batch change the tokens it picks. No onnxruntime anywhere."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from kernel.lm.contract import CacheLayout, LanguageModelContract
from serve.execution.runtime import ProviderReport
from serve.lm.cache import BatchCache, CopiedCache, KVCache
from serve.lm.model import LanguageModel
from serve.lm.text import TextCodec

VOCAB = 64
BOS, EOS, PAD = 0, 1, 2
WORDS = ["user", "assistant", "system", *(f"w{i}" for i in range(VOCAB - 6))]  # ids 3..63
CPU = ProviderReport(("CPUExecutionProvider",), ("CPUExecutionProvider",), ())
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {{ eos_token }} "
    "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
)


def word(name: str) -> int:
    """A word's token id."""
    return WORDS.index(name) + 3


def tokenizer() -> Tokenizer:
    vocab = {"<s>": BOS, "</s>": EOS, "<pad>": PAD, **{w: i + 3 for i, w in enumerate(WORDS)}}
    built = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    built.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    built.add_special_tokens(["<s>", "</s>", "<pad>"])
    built.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    built.decoder = decoders.WordPiece(prefix="##")
    return built


def contract(version: int = 1, **overrides: Any) -> LanguageModelContract:
    raw: dict[str, Any] = {
        "schema": "rlserve.policy/v1",
        "kind": "causal-lm",
        "algorithm": "grpo",
        "source": {
            "framework_version": "5.0",
            "architecture": "FakeForCausalLM",
            "checkpoint": "fake",
            "sha256": "0" * 64,
        },
        "vocab_size": VOCAB,
        "context_length": 64,
        "num_layers": 1,
        "num_kv_heads": 1,
        "head_dim": 1,
        "prompt_encoding": "with_special_tokens",
        "bos_token_id": BOS,
        "pad_token_id": PAD,
        "eos_token_ids": [EOS],
        "special_tokens": {"bos_token": "<s>", "eos_token": "</s>"},
        "chat_template": TEMPLATE,
        "generation_defaults": {"max_new_tokens": 8},
        "policy_version": version,
        "exporter": {"version": "test"},
        "opset": 18,
        "created_at": "2026-01-01T00:00:00Z",
        "golden": [],
    }
    return LanguageModelContract.model_validate({**raw, **overrides})


def next_token_logits(total: int, position: int, attended: int, token: int) -> np.ndarray:
    """The logits after ``token`` at ``position``, having attended to ``attended`` tokens
    summing to ``total``: a peak at one token, smooth around it (so sampling varies); EOS
    only where it is the peak."""
    peak = (total * 31 + position * 7 + attended * 3 + token) % VOCAB
    if peak == EOS and position < 6:  # no sequence ends too early to test anything
        peak = 5
    distance = (np.arange(VOCAB) - peak) % VOCAB
    logits = -0.35 * np.minimum(distance, VOCAB - distance)
    if peak != EOS:
        logits[EOS] = -80.0  # a sampled sequence (almost) never ends early by chance
    return logits.astype(np.float32)


class FakeDecoder:
    """A :class:`serve.lm.decoder.Decoder` whose keys hold the token ids it has seen.
    ``step_s`` slows every call down; ``calls`` records (kind, rows) per call. ``layout``:
    where a step puts each row's new token, as a graph of that cache layout does (after the
    last column, or just after the row's own tokens)."""

    vocab_size = VOCAB

    def __init__(self, step_s: float = 0.0, layout: CacheLayout = CacheLayout.LEFT_PADDED) -> None:
        self.step_s = step_s
        self.layout = layout
        self.calls: list[tuple[str, int]] = []
        self.threads: set[int] = set()
        self.fail_on: int | None = None  # a token that breaks a step

    def _called(self, kind: str, rows: int) -> None:
        self.calls.append((kind, rows))
        self.threads.add(threading.get_ident())
        if self.step_s:
            time.sleep(self.step_s)

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, KVCache]:
        self._called("prefill", 1)
        keys = np.asarray(ids, np.float32).reshape(1, 1, -1, 1)
        cache = KVCache.of_rows([keys], [np.zeros_like(keys)], self.layout)
        logits = [
            next_token_logits(int(sum(ids[: p + 1])), p, p + 1, ids[p]) for p in range(len(ids))
        ]
        return np.stack(logits), cache

    def batch_cache(self, tokens: int) -> BatchCache:
        return CopiedCache(self.step)

    def step(self, cache: KVCache, tokens: np.ndarray) -> tuple[np.ndarray, KVCache]:
        self._called("step", len(tokens))
        if self.fail_on is not None and (tokens == self.fail_on).any():
            raise RuntimeError(f"the fake cannot take token {self.fail_on}")
        mask, positions = cache.step_inputs()
        assert mask.shape == (cache.rows, cache.columns + 1)
        assert positions.shape == (cache.rows, 1)
        keys = np.zeros((cache.rows, 1, cache.columns + 1, 1), np.float32)
        keys[:, :, : cache.columns] = cache.keys[0]
        if self.layout is CacheLayout.LEFT_PADDED:
            keys[:, 0, -1, 0] = tokens
        else:  # each row's new token just after its own (what follows them is never read)
            keys[np.arange(cache.rows), 0, cache.lengths, 0] = tokens
            keys[:, 0, :, 0][mask == 0] = 99.0  # garbage: a wrong mask would count it
        seen = keys[:, 0, :, 0] * mask
        logits = np.stack(
            [
                next_token_logits(
                    int(seen[r].sum()), int(positions[r, 0]), int(mask[r].sum()), int(t)
                )
                for r, t in enumerate(tokens)
            ]
        )
        return logits, cache.grown([keys], [np.zeros_like(keys)], mask)

    def forward(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        self._called("forward", len(rows))
        longest = max(len(r) for r in rows)
        logits = np.zeros((len(rows), longest, VOCAB), np.float32)
        for r, row in enumerate(rows):
            for p in range(len(row)):
                logits[r, p] = next_token_logits(int(sum(row[: p + 1])), p, p + 1, row[p])
        return logits


def codec(**overrides: Any) -> TextCodec:
    return TextCodec(tokenizer(), contract(**overrides), "fake/1")


def language_model(
    version: int = 1, decoder: FakeDecoder | None = None, name: str = "fake", **overrides: Any
) -> LanguageModel:
    built = contract(version, **overrides)
    return LanguageModel(
        name,
        version,
        built,
        decoder or FakeDecoder(),
        TextCodec(tokenizer(), built, f"{name}/{version}"),
        f"{version:064d}",
        CPU,
    )


def reference(ids: Sequence[int], new_tokens: int, *, stop_at_eos: bool = True) -> list[int]:
    """Greedy decoding of one sequence, straight from the logits function (``stop_at_eos``
    False: EOS is a token like any other, as with ``ignore_eos``)."""
    tokens = list(ids)
    out: list[int] = []
    for _ in range(new_tokens):
        position = len(tokens) - 1
        token = int(np.argmax(next_token_logits(sum(tokens), position, len(tokens), tokens[-1])))
        out.append(token)
        tokens.append(token)
        if token == EOS and stop_at_eos:
            break
    return out
