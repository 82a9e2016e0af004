"""The CleanRL-style torch source: an ``nn.Module`` whose method returns (distribution, value),
probed once, and handed to :mod:`export.actor_critic` as a ``PolicySource``.
"""
