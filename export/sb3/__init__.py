"""The Stable-Baselines3 source: a PPO or A2C ``.zip`` (plus VecNormalize statistics) read
without its environment and handed to :mod:`export.actor_critic` as a ``PolicySource``.

Light on purpose: the CLI imports :mod:`export.sb3.layout` when it parses its arguments, so
this package imports nothing heavy.
"""
