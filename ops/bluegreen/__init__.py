"""Blue-green releases on Kubernetes, through ``kubectl`` only (``rlserve rollout``).

``switch`` moves traffic between colors (deploy, promote, rollback, retire), ``verify``
proves a color serves what its contract promises, ``status`` reports both colors,
``retain`` prunes old model versions, ``kubectl`` runs (or prints) the commands.
"""
