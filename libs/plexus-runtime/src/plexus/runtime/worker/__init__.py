"""Serving agent types: the worker, activations, commits, mailboxes, partitions, intake, upkeep, run control
and retries, run-end reports, dead letters and the context backend."""
