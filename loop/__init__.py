"""The inference side of RL training: experience records (``experience``), the buffers
that carry them from rollout workers to a trainer (``buffers``), the rollout worker
(``collect``, ``rlserve collect``) and the trainer's staleness controller (``controller``).
Never imports torch; installed with the ``loop`` extra."""
