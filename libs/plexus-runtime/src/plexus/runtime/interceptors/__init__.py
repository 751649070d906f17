"""The interceptor chain (tracing included) and the cross-cutting features built on it: run control and
metrics."""
