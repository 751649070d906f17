"""Plexus runtime: agents as NATS JetStream consumers."""

__all__: list[str] = []
