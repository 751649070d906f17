"""Talking to the cluster: the Runtime and its run-tree calls, the connection value, the orchestrator
client and the supervisors."""
