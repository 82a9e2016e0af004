"""Language-model frontends: native generate and score routes, and the OpenAI-compatible ones."""
