"""A loaded language-model version (kind ``causal-lm``): its graph, tokenizer and limits.

Built by :meth:`LanguageModel.load` from a version directory (``model.onnx`` and the
tokenizer beside it) once its session exists: the contract is read from the session's
metadata, the tokenizer loaded, and the golden prompts decoded greedily
(``kernel.lm.greedy.check_golden``); any failure is a ModelLoadError.

A version checks and tokenizes the calls routed to it (:meth:`LanguageModel.
prepare_generation`, :meth:`LanguageModel.prepare_scoring`): the prompt must leave room for
a new token in the context (a prompt given as token ids: ids in the vocabulary), and
``max_new_tokens`` is cut to what is left. Parameters a call leaves out come from the
contract's generation defaults.

It sits where actor-critic versions sit (a model's lifecycle, the manager), so it also
answers the predict path's calls, by saying that a language model is asked through
``generate``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kernel.contract import METADATA_KEY
from kernel.errors import ContractError, InvalidInput, ModelLoadError, quoted
from kernel.lm import contract as lm_contract
from kernel.lm import greedy
from kernel.lm.contract import LanguageModelContract
from kernel.lm.sampling import SamplingParams
from serve.dataplane.kinds import ModelKind
from serve.execution.runtime import ProviderReport, Session
from serve.lm.decoder import Decoder, GraphDecoder
from serve.lm.messages import Generation, GenerationSpec, ScoreSpec, Scoring
from serve.lm.sequence import DecodingSequence
from serve.lm.text import TextCodec

if TYPE_CHECKING:
    from serve.config import FeatureView

__all__ = ["LanguageModel"]


class LanguageModel:
    kind = lm_contract.KIND
    model_kind: ClassVar[ModelKind] = ModelKind.GENERATIONS
    features: FeatureView | None = None  # a language model reads no features view

    def __init__(
        self,
        name: str,
        version: int,
        contract: LanguageModelContract,
        decoder: Decoder,
        codec: TextCodec,
        sha256: str,
        provider_report: ProviderReport,
    ) -> None:
        self.name, self.version, self.contract, self.sha256 = name, version, contract, sha256
        self.decoder = decoder
        self.codec = codec
        self.provider_report = provider_report
        self.provider = provider_report.primary
        self.eos = frozenset(contract.eos_token_ids)
        self.context_length = contract.context_length
        # Bytes of key/value cache one token of one sequence holds (float32 keys and values).
        self.cache_bytes_per_token = (
            2 * 4 * contract.num_layers * contract.num_kv_heads * (contract.head_dim)
        )

    @classmethod
    def load(
        cls, name: str, version: int, directory: Path, session: Session, sha256: str
    ) -> LanguageModel:
        """The version in ``directory`` over its built session: contract, tokenizer, golden
        prompts re-run."""
        origin = f"{name}/{version}"
        text = session.metadata.get(METADATA_KEY)
        if text is None:
            raise ContractError(f"{origin}: model.onnx has no policy contract ({METADATA_KEY})")
        contract = lm_contract.parse(text, origin)
        codec = TextCodec.load(directory, contract, origin)
        problems = greedy.check_golden(contract, session.run)
        if problems:
            raise ModelLoadError(
                f"{origin}: golden prompts do not reproduce: {'; '.join(problems)}"
            )
        decoder = GraphDecoder(session.run, contract, session.binder)
        return cls(name, version, contract, decoder, codec, sha256, session.report)

    # ------------------------------------------------------------------ calls

    def prepare_generation(
        self, spec: GenerationSpec, *, like: Generation | None = None
    ) -> Generation:
        """Tokenize a generate call (or check its token ids) against this version's
        vocabulary and context. ``max_new_tokens`` beyond what the context leaves after
        the prompt is cut to it: the generation stops when the context is full
        (``finish_reason`` length), as vLLM does. ``like``: the call's previous generation
        (a group's choices, several prompts'); when it has the same prompt, its tokens are
        taken as they are instead of tokenizing the prompt again."""
        if like is not None and (spec.prompt, spec.messages) == (
            like.spec.prompt,
            like.spec.messages,
        ):
            return self._generation(spec, like.prompt_ids)
        if isinstance(spec.prompt, tuple):
            prompt_ids = self._checked_ids(spec.prompt)
        else:
            prompt_ids = self._prompt_ids(spec.prompt, spec.messages)
        return self._generation(spec, prompt_ids)

    def prepare_generations(self, specs: Sequence[GenerationSpec]) -> list[Generation]:
        """A call's generations, each prompt tokenized once where it repeats."""
        generations: list[Generation] = []
        for spec in specs:
            like = generations[-1] if generations else None
            generations.append(self.prepare_generation(spec, like=like))
        return generations

    def _generation(self, spec: GenerationSpec, prompt_ids: tuple[int, ...]) -> Generation:
        room = self.context_length - len(prompt_ids)
        defaults = self.contract.generation_defaults
        asked = defaults.max_new_tokens if spec.max_new_tokens is None else spec.max_new_tokens
        max_new_tokens = min(asked, room)
        temperature = spec.temperature
        if temperature is None:
            temperature = defaults.temperature if defaults.do_sample else 0.0
        sampling = SamplingParams(
            temperature,
            defaults.top_p if spec.top_p is None else spec.top_p,
            defaults.top_k if spec.top_k is None else spec.top_k,
            spec.seed,
        )
        return Generation(spec, self.version, prompt_ids, max_new_tokens, sampling, self.eos)

    def prepare_scoring(self, spec: ScoreSpec) -> Scoring:
        """Tokenize a score call; each prompt + completion must fit the context."""
        prompt_ids = self._prompt_ids(spec.prompt, spec.messages)
        completions = []
        for index, text in enumerate(spec.completions):
            ids = tuple(self.codec.encode_completion(text))
            if not ids:
                raise InvalidInput(f"completions[{index}]: encodes to no tokens; nothing to score")
            total = len(prompt_ids) + len(ids)
            if total > self.context_length:
                raise InvalidInput(
                    f"completions[{index}]: {len(ids)} tokens after a prompt of "
                    f"{len(prompt_ids)} make {total}, beyond the context of model "
                    f"{quoted(self.name)}: {self.context_length} tokens"
                )
            completions.append(ids)
        return Scoring(spec, self.version, prompt_ids, tuple(completions))

    def sequence(self, generation: Generation, *, streamed: bool) -> DecodingSequence:
        """A new decoding state for a generation this version prepared (``streamed``: its
        text is handed out token by token)."""
        return DecodingSequence(generation, self.codec, incremental=streamed)

    def _prompt_ids(
        self, prompt: str | None, messages: Sequence[dict[str, Any]] | None
    ) -> tuple[int, ...]:
        field = "prompt" if messages is None else "messages"
        if messages is not None:
            ids = self.codec.encode_chat(messages)
        else:
            ids = self.codec.encode_prompt(prompt or "")
        if not ids:
            raise InvalidInput(f"{field}: encodes to no tokens; give some text")
        return self._fitting(field, ids)

    def _checked_ids(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        """A prompt given as token ids: every id in this version's vocabulary."""
        vocabulary = self.contract.vocab_size
        for index, token in enumerate(ids):
            if token >= vocabulary:
                raise InvalidInput(
                    f"prompt[{index}]: token id {token} is outside the vocabulary of model "
                    f"{quoted(self.name)}: its ids are 0 to {vocabulary - 1}"
                )
        return self._fitting("prompt", ids)

    def _fitting(self, field: str, ids: Sequence[int]) -> tuple[int, ...]:
        """A prompt's ids, when they leave room in the context for a new token."""
        if len(ids) >= self.context_length:
            raise InvalidInput(
                f"{field}: {len(ids)} tokens, longer than model {quoted(self.name)} can "
                f"take: its context holds {self.context_length} tokens, the prompt and at "
                f"least one new token, so a prompt may have at most {self.context_length - 1}"
            )
        return tuple(ids)

    # ------------------------------------------------------------------ reports

    def warm_up(self, sizes: Sequence[int]) -> dict[int, float]:
        """Prefill a golden prompt and step batches of each size once: seconds per step."""
        prompt = self.contract.golden[0].prompt_ids if self.contract.golden else [0]
        _, cache = self.decoder.prefill(prompt)
        seconds = {}
        reach = cache.columns + 2  # the prompt and the two steps timed
        for size in sizes:
            rows = self.decoder.batch_cache(size * reach)
            rows.add([cache] * size, reach)
            tokens = np.zeros(size, np.int64)
            rows.step(tokens)
            started = time.perf_counter()
            rows.step(tokens)
            seconds[size] = time.perf_counter() - started
        return seconds

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": self.kind,
            "sha256": self.sha256,
            "provider": self.provider,
            "contract": self.contract.model_dump(mode="json", by_alias=True),
        }
