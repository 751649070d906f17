"""The interceptor base class and its inputs (what users subclass), the one composition function of chains
and message steps (`compose`), and tracing, which the client's send and publish chains use too.

The worker's built-in interceptors (run control, retries, logging, metrics, deadlines) and the order of the
whole message pipeline are in `worker/pipeline/`."""
