"""Where state lives in JetStream: topology, EventLogs, checkpoints, leases, registry, subscriptions,
artifacts, the `Connection` value that hands them out together, and which failures are outages."""
