"""rmgate's Grafana dashboard and Prometheus alert rules, generated from code.

``python -m deployments.monitoring`` writes them under ``generated/`` here (checked in, so
an operator takes the files without running anything); ``tests/unit/test_monitoring.py``
fails when the checked-in files differ from what the code generates, or when a query names
a metric the gateway does not expose. A tool for the repository, not part of the serving
path: it needs the dev extra (``grafana-foundation-sdk``, ``promql-parser``).
"""
