"""The policy format's kernel: what the exporter writes, the server reads and every client
and trainer shares. The policy contract (``contract``), observation and action spaces
(``spaces``), action distributions (``distributions``), a recurrent policy's memory as
its graph takes it (``memory``), the language-model side (``lm``: the ``causal-lm``
contract, greedy decoding of golden prompts, sampling arithmetic), the one error hierarchy
and its codes (``errors``), and how client input is quoted in messages (``json_shown``,
``identifiers``).

It imports nothing else of ours (an import contract of pyproject.toml says so), and
nothing heavy: numpy and pydantic.
"""

__version__ = "0.1.0"  # the distribution's (rlserve): written into every contract
