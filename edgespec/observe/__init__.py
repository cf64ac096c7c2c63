"""Observability: spans and metrics where things happen (OpenTelemetry API only), structured logs, and
the exporters a service installs (Prometheus endpoint, OTLP) — the core never imports exporters.
"""
