"""Scheduling a language model's requests: the continuous-batching scheduler
(``scheduler``), its step rules (``step_plan``, pure), what a frontend holds while a
generation decodes (``generation_stream``) and the record the metrics count
(``generation_record``)."""
