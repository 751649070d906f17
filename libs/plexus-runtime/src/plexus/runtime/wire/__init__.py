"""What travels: envelopes, subjects, the orchestration wire protocol."""
