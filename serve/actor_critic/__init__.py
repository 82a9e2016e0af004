"""Policy kinds: what a loaded model version does with requests. Actor-critic policies
(PPO, A2C) today; causal language-model policies next, each with its own validation,
execution and answers behind ``serve.dataplane.model.ServedModel``."""
