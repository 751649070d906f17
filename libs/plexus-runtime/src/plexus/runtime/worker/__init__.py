"""Serving agent types: the worker, activations, mailboxes, partitions, intake, upkeep, run-end reports,
dead letters and the context backend."""
