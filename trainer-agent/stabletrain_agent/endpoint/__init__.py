"""The agent's HTTP endpoint, what the operator scrapes and writes to: `exporter` (the
status and Prometheus metrics a rank publishes), `http_server` and `routes` (the server and
its paths), `directive_inbox` (live directives PUT by the operator), `heartbeat` (proof
that a rank still makes progress). Torch-free, so the supervisor serves with the same server.
"""
