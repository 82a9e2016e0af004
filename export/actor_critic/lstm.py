"""One time step of an ``nn.LSTM``, written out over its own weights.

torch.export cannot trace ``nn.LSTM`` (its forward runs a fused kernel in a loop), and a
policy served step by step needs one step of it: four gates per layer. The parity gate
holds the written-out step to the source's own ``nn.LSTM`` over whole sequences.

- :func:`lstm_step` takes and returns states with the batch first (``[B, layers,
  hidden]``), as the exported graph holds them;
- :class:`SteppedLSTM` stands in for an ``nn.LSTM`` inside a module's own code (a
  CleanRL-style agent calling ``self.lstm(x, (h, c))`` on one time step), taking and
  returning what ``nn.LSTM`` does: ``x`` ``[1, B, in]``, states ``[layers, B, hidden]``;
- :func:`segments`, :func:`as_lstm_takes` and :func:`state_rows` move a policy's memory
  (one ``[B, size]`` row per observation, its segments one after another, as the
  contract's ``StateLayout`` says) to and from those shapes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from export.errors import ExportError
from kernel.contract import StateLayout


def check_steppable(lstm: nn.LSTM, what: str) -> None:
    """ExportError for the LSTMs :func:`lstm_step` does not step."""
    refused = []
    if lstm.bidirectional:
        refused.append("bidirectional")
    if lstm.proj_size:
        refused.append(f"proj_size={lstm.proj_size}")
    if lstm.batch_first:
        refused.append("batch_first")
    if refused:
        raise ExportError(
            f"{what} is {' and '.join(refused)}; rlserve steps unidirectional, sequence-first "
            "LSTMs without projections (RecurrentPPO's and CleanRL's)"
        )


def lstm_step(lstm: nn.LSTM, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One time step of ``lstm`` for rows ``x`` [B, in]: states ``h``, ``c`` [B, layers,
    hidden] -> (top layer's output [B, hidden], next h, next c), with torch's gate order
    (input, forget, cell, output)."""
    hs, cs = [], []
    for k in range(lstm.num_layers):
        gates = (
            x @ getattr(lstm, f"weight_ih_l{k}").T + h[:, k] @ getattr(lstm, f"weight_hh_l{k}").T
        )
        if lstm.bias:
            gates = gates + getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}")
        i, f, g, o = gates.chunk(4, dim=-1)
        c_k = torch.sigmoid(f) * c[:, k] + torch.sigmoid(i) * torch.tanh(g)
        x = torch.sigmoid(o) * torch.tanh(c_k)
        hs.append(x)
        cs.append(c_k)
    return x, torch.stack(hs, dim=1), torch.stack(cs, dim=1)


class SteppedLSTM(nn.Module):
    """An ``nn.LSTM`` as one traceable time step, with the same call and attributes."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm
        self.input_size = lstm.input_size
        self.hidden_size = lstm.hidden_size
        self.num_layers = lstm.num_layers

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, ...]]:
        h, c = state
        out, h_next, c_next = lstm_step(self.lstm, x[0], h.transpose(0, 1), c.transpose(0, 1))
        return out.unsqueeze(0), (h_next.transpose(0, 1), c_next.transpose(0, 1))


def segments(state: Tensor, layout: StateLayout) -> list[Tensor]:
    """A [B, size] state as its segments, each [B, layers, hidden]."""
    parts = state.split([segment.size for segment in layout.segments], dim=1)
    return [
        part.reshape(-1, segment.layers, segment.hidden)
        for part, segment in zip(parts, layout.segments, strict=True)
    ]


def as_lstm_takes(state: Tensor, layout: StateLayout) -> list[Tensor]:
    """A [B, size] state as its segments, each [layers, B, hidden] as ``nn.LSTM`` takes
    them (h, c of the first LSTM, then of the next)."""
    return [part.transpose(0, 1).contiguous() for part in segments(state, layout)]


def state_rows(parts: list[Tensor]) -> Tensor:
    """Segments as ``nn.LSTM`` returns them, each [layers, B, hidden], as [B, size] rows."""
    return torch.cat([part.transpose(0, 1).reshape(part.shape[1], -1) for part in parts], dim=1)
