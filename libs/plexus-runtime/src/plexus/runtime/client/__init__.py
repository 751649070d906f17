"""Talking to the cluster: the Runtime and its run-tree calls, sends and their replies, the orchestrator
client and the supervisors."""
