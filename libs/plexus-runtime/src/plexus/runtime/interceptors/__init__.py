"""The interceptor chain (tracing included) and the cross-cutting features built on it: deadlines and metrics.

Run control and retries call the orchestrator, so they live above the client: `worker/_run_control.py`."""
