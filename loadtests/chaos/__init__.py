"""A chaos suite for rlserve: locust load while faults are injected, and an honest account.

``python -m loadtests.chaos --help`` lists the options; docs/chaos.md explains the faults,
the accounting and the gates. Every module here is named ``_*.py`` so that
``locust -f loadtests/`` (which loads every other ``.py`` file under the folder) never
picks the chaos users up as part of the ordinary load test.
"""
