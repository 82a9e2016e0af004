"""GRPO's inference side: prompts sampled as groups by the server, scored by a reward
function, published as :class:`~loop.experience.Completion` records (docs/rl-loop.md,
"GRPO"). The trainer (torch) is ``examples/grpo_trainer.py``."""
