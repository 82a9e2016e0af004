"""The JSON predict frontend: ``POST /predict`` and ``/v1/models/{model}/predict``."""
