"""Stores the data plane reads beside the model: online features (``features``, Feast in
``feast_store``), the result cache (``result_cache``) and the Redis link both share
(``redis_link``)."""
