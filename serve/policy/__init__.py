"""The policy kind (``ModelKind.ROWS``; contract kind ``actor_critic``): every exported
policy whose requests are rows of one forward pass — PPO, A2C, DQN, QR-DQN, SAC, TD3, DDPG,
their recurrent and masked variants. The served version (``version``), how one loads
(``loading``), request validation compiled from the contract (``validation``), the policy
heads (``heads``), action masks (``masks``), recurrent memory (``memory``) and the kind's
plug-in (``plugin``)."""
