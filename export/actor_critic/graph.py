"""The exported graph: raw observations in; action, distribution parameters and value out.

``PolicyGraph`` chains three parts that every source provides:

1. one preprocessing pipeline per observation input (normalisation, HWC to CHW);
2. a *core*, the source's own network, mapping preprocessed observations to the
   distribution's parameters (``(logits,)`` or ``(mean, log_std)``) and the value ``[B]``;
3. a head computing the deterministic action from the first parameter.
"""

from __future__ import annotations

from torch import Tensor, nn

Parameters = tuple[Tensor, ...]


class PolicyGraph(nn.Module):
    def __init__(self, pipelines: nn.ModuleList, core: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.pipelines = pipelines
        self.core = core
        self.head = head

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        prepared = [pipeline(x) for pipeline, x in zip(self.pipelines, inputs, strict=True)]
        parameters, value = self.core(prepared)
        return (self.head(parameters[0]), *parameters, value)
