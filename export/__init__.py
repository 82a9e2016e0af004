"""rlserve's export side: trained policies to ONNX with an embedded policy contract.

Needs the ``export`` extra (torch, onnx, stable-baselines3, gymnasium); modules import them
lazily where a serving-only install may import this package (the CLI's argument parsing).
"""
