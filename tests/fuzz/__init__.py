"""A seeded fuzzer of our own (issue 9): mutated envelopes and orchestrator requests sent with a raw nats-py
client to every subject a client can reach, against a real worker and orchestrator process, with liveness
rounds through `Runtime` between batches. `python -m tests.fuzz --messages N --seed S`; `make fuzz`."""
