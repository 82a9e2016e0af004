"""Batching: how a model's admitted calls become batches and come back as answers.

The dynamic batch scheduler (``dynamic_batcher``) queues rows (``row_queue``), asks a pure
function when and how much to run (``plan``), runs and delivers a batch (``batch_run``),
cuts calls larger than a batch (``split``), holds recurrent sequences' memory
(``sequences``) and records every batch it ran (``record``).
"""
