"""Execution: onnxruntime sessions, their providers (``runtime``) and graphs cut down to
some of their outputs (``graph_cut``)."""
