"""Plexus kernel primitives: pure values with no I/O."""

__all__: list[str] = []
