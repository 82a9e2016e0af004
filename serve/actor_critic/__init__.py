"""Actor-critic policies (kind ``actor_critic``: PPO, A2C): the served version (``policy``),
request validation compiled from the contract (``validation``), the policy heads (``heads``)."""
