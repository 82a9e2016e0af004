"""The language-model side of the policy format: the ``causal-lm`` contract, and the rules
the exporter's parity gate and the server share (greedy decoding of golden prompts, the
sampling and log-softmax arithmetic)."""
