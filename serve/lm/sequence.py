"""One generation while it is decoded: its tokens, its text, and when it ends.

A sequence ends (``finish`` is set) when it chooses one of the version's EOS tokens (kept
in its ids, as ``transformers.generate`` keeps it; unless the caller asked ``ignore_eos``,
as benchmarks do to run exactly ``max_new_tokens``), when its text contains one of the
caller's stop strings (the text is cut before it), or after ``max_new_tokens``. Text is
handed out token by token, never past a possible stop string, when it is ``incremental``
(someone streams it, or stop strings must be looked for); otherwise the text is decoded
once, at the end, and the events carry none.
"""

from __future__ import annotations

from kernel.lm.sampling import Alternatives, Sampler
from serve.lm.messages import FinishReason, Generation, PromptLogProbs, TokenEvent
from serve.lm.text import Detokenizer, StopStrings, TextCodec

__all__ = ["DecodingSequence"]


class DecodingSequence:
    __slots__ = (
        "_codec",
        "_detokenizer",
        "_eos",
        "_given",
        "_incremental",
        "_sampler",
        "_stopping",
        "_stops",
        "_text",
        "finish",
        "generation",
        "log_probs",
        "prompt",
        "text",
        "token_ids",
        "top",
    )

    def __init__(self, generation: Generation, codec: TextCodec, *, incremental: bool) -> None:
        self.generation = generation
        self._codec = codec
        self._eos = frozenset() if generation.spec.ignore_eos else generation.eos
        self._sampler = Sampler(generation.sampling)
        self._detokenizer = Detokenizer(codec)
        self._stops = StopStrings(generation.spec.stop)
        self._stopping = bool(self._stops)  # stop strings to look for
        self._incremental = incremental or self._stopping
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.top: list[Alternatives] = []  # per token, when alternatives are asked for
        self.prompt: PromptLogProbs | None = None  # the prompt scored, when asked (echo)
        self._text = ""  # the text of the tokens so far
        self._given = 0  # characters of it handed out in events
        self.text = ""  # the final text, once finished
        self.finish: FinishReason | None = None

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    def accept(self, token: int, log_prob: float, top: Alternatives = ()) -> TokenEvent:
        """Take the chosen token (and the likeliest alternatives at its position, when they
        are asked for): the event to hand out, and ``finish`` set if it ends here."""
        index = len(self.token_ids)
        self.token_ids.append(token)
        self.log_probs.append(log_prob)
        event = self._accepted(index, token, log_prob)
        if top:
            self.top.append(top)
            event.top = top  # before anyone sees the event
        return event

    def _accepted(self, index: int, token: int, log_prob: float) -> TokenEvent:
        if not self._incremental:
            return self._quietly(index, token, log_prob)
        piece = self._detokenizer.push(token)
        if token in self._eos:
            self.finish = FinishReason.STOP
        elif self._stopping:
            self._text += piece
            if (cut := self._stops.find(self._text)) is not None:
                self._text = self._text[:cut]
                self.finish = FinishReason.STOP
                return self._event(index, token, log_prob, final=True, flush=False)
            if index + 1 >= self.generation.max_new_tokens:
                self.finish = FinishReason.LENGTH
            return self._event(index, token, log_prob, final=self.finish is not None, flush=True)
        elif index + 1 >= self.generation.max_new_tokens:
            self.finish = FinishReason.LENGTH
        self._text += piece
        if self.finish is not None:
            return self._event(index, token, log_prob, final=True, flush=True)
        self._given += len(piece)  # no stop string to hold text back for: all of it goes
        return TokenEvent(index, token, log_prob, piece)

    def _quietly(self, index: int, token: int, log_prob: float) -> TokenEvent:
        """Accept a token of a sequence nobody reads piece by piece: its text at the end."""
        if token in self._eos:
            self.finish = FinishReason.STOP
        elif len(self.token_ids) >= self.generation.max_new_tokens:
            self.finish = FinishReason.LENGTH
        if self.finish is not None:
            self.text = self._codec.decode(self.token_ids)
        return TokenEvent(index, token, log_prob, "")

    def _event(
        self, index: int, token: int, log_prob: float, *, final: bool, flush: bool
    ) -> TokenEvent:
        if final:
            if flush:
                self._text += self._detokenizer.flush()
                cut = self._stops.find(self._text) if self._stops else None
                if cut is not None:
                    self._text, self.finish = self._text[:cut], FinishReason.STOP
            self.text = self._text
            safe = len(self._text)
        else:
            safe = self._stops.safe(self._text) if self._stops else len(self._text)
        piece = self._text[self._given : safe]
        self._given = max(self._given, safe)
        return TokenEvent(index, token, log_prob, piece)
