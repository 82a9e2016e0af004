"""Exporting a causal language model (DPO/GRPO policies as TRL writes them) to a ``causal-lm``
version: an ONNX decoder with a key/value cache, its tokenizer and the contract of
:mod:`kernel.lm.contract`, written only after greedy parity with ``transformers.generate``.

Needs the ``export`` extra (torch, transformers, peft, onnx); nothing here is imported when
the CLI only parses its arguments.
"""
