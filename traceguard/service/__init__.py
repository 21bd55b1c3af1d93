"""The service's own functions, shared by the HTTP API (``api/``) and the CLI: intake of uploaded
files into a run, background analysis jobs, and the worker pool that runs them.

Flow: ingest (classify/validate uploads) → pipeline (analysis) → report → store → here → api/cli.
"""
