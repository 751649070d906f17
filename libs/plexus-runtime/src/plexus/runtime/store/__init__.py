"""Where state lives in JetStream: topology, EventLogs, checkpoints, leases, registry, subscriptions,
artifacts, commits, and which failures are outages."""
