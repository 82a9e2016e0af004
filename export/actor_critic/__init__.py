"""The actor-critic export both RL sources share (:mod:`export.sb3`, :mod:`export.modules`).

A ``PolicySource`` becomes an ONNX graph of raw observations in and action, distribution
parameters and value out; parity against the source, the ``actor_critic`` contract with its
golden vectors, and a verified atomic write follow.
"""
