"""Operating a cluster: nats-server processes, credentials and TLS, security init and permissions,
telemetry, health endpoints, settings."""
