"""Benchmarks: Plexus against raw nats-py and AutoGen's gRPC runtime (`make bench`, `make bench-quick`)."""
