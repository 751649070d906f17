"""The least each Plexus role needs from NATS, as nats-server permissions (docs/security.md has the table).

Roles live inside a tenant's account (tenants are separate accounts: nothing crosses between them). Within a
tenant, writes are what the roles are told apart by: only the orchestrator publishes control decisions and
writes run records; only workers write EventLogs, checkpoints and leases, and a worker given agent types (a
tenant's narrowed worker, or a worker group of `plexus security init --worker-group`) only those of its own
types, and it serves (registers, subscribes to, takes inbox partitions of, publishes progress and token
deltas for) only those types; the gateway writes sessions; a client sends to inboxes, asks the
orchestrator, and reads progress. Reads through JetStream consumers are coarser: nats-server does not check
a consumer's filter against its creator's subject permissions (nats-server #3295), so whoever may create a
consumer on a stream may read all of it; each role may create consumers only on the streams it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plexus.runtime.wire._subjects import escape_token

__all__ = ["ROLES", "Permissions", "role_permissions"]

ROLES = ("operator", "orchestrator", "worker", "gateway", "client")

# Stream administration stays with the operator (`plexus security init` prints the one command to create
# the topology as the operator): the other roles look the topology up, they never create or change it.
_ADMIN_DENY = [
    "$JS.API.STREAM.CREATE.>",
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.STREAM.RESTORE.>",
    "$JS.API.STREAM.SNAPSHOT.>",
    "$JS.API.ACCOUNT.PURGE.>",
]


@dataclass
class Permissions:
    publish_allow: list[str] = field(default_factory=list)
    publish_deny: list[str] = field(default_factory=list)
    subscribe_allow: list[str] = field(default_factory=list)
    subscribe_deny: list[str] = field(default_factory=list)


#: The run records' writes, which `Runtime.wait_run` follows (it reads the records anyway: no new access).
_RUN_RECORDS = "$KV.plexus_runs.run.>"


def _lookup(streams: list[str], *, consume: bool = True) -> list[str]:
    """Find the topology, read stream messages and KV entries, and (`consume`) consume the given streams.
    Deleting a consumer is no part of it: names of others' consumers must not be deletable."""
    out = ["$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
    for stream in streams:
        out += [
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>",
        ]
        if consume:
            out += [
                f"$JS.API.CONSUMER.CREATE.{stream}",
                f"$JS.API.CONSUMER.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.INFO.{stream}.>",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
                f"$JS.ACK.{stream}.>",
                f"$JS.FC.{stream}.>",
            ]
    return out


def _partition_consumers(prefix: str, tokens: list[str]) -> list[str]:
    """A worker's inbox partitions: it creates their consumers only with a filter inside its own types
    (`tokens`: escaped type tokens, or ``*``; the create request's subject carries the filter, which the
    server checks against the config), and pulls, acknowledges and deletes them by name. Names end in a
    random nonce and are found only in their records (`store._consumer_records`), which it reads (a direct
    get by key: the key is in the request's subject) and writes for its own types only. It may not list
    the inbox's consumers (``CONSUMER.NAMES``/``LIST``), nor read the records otherwise."""
    stream = "PLEXUS_INBOX"
    records = "plexus_consumers"
    return [
        *(f"$JS.API.CONSUMER.CREATE.{stream}.*.{prefix}.*.inp.{t}.>" for t in tokens),
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        *(f"$KV.{records}.*.{t}.*" for t in tokens),
        *(f"$JS.API.DIRECT.GET.KV_{records}.$KV.{records}.*.{t}.*" for t in tokens),
    ]


def role_permissions(
    role: str, inbox: str, prefix: str = "px", agent_types: list[str] | None = None
) -> Permissions:
    """Permissions of `role` whose reply inbox prefix is `inbox` (``_INBOX.<name>``). For a worker,
    `agent_types` limits what it serves and writes to those types (None: any type): registrations, stateless
    inboxes, inbox partition consumers, progress, token deltas, EventLogs, checkpoints and leases."""
    p = prefix
    own_inbox = f"{inbox}.>"
    replies = "_INBOX.>"  # publishing a reply to anyone's inbox; subscribing only to one's own
    kv = {
        name: f"KV_plexus_{name}"
        for name in ("checkpoints", "registry", "workers", "leases", "runs", "subscriptions", "sessions")
    }
    if role == "operator":
        return Permissions(publish_allow=[">"], subscribe_allow=[">"])
    if role == "orchestrator":
        return Permissions(
            publish_allow=[
                f"{p}.*.in.>",  # a run's root message
                f"{p}.*.ctl.>",  # cancel / pause decisions
                f"{p}.*.ctr.>",
                f"{p}.*.progress.>",  # its decisions, on the tree's progress subjects
                f"{p}.*.evlog.orchestrator.>",  # its decisions' log (agent type "orchestrator")
                # Scheduled runs: their schedules and the fires `trigger` writes (`sched._run` is no type).
                f"{p}.*.sched._run.>",
                "$KV.plexus_runs.>",
                replies,
                "$SRV.>",
                *_lookup(
                    [
                        kv["runs"],
                        kv["subscriptions"],
                        kv["registry"],
                        kv["workers"],
                        "PLEXUS_COUNTERS",
                        "PLEXUS_EVENTS",
                        "PLEXUS_PROGRESS",
                        kv["leases"],
                        "PLEXUS_SCHEDULES",  # the scheduled runs' fires, one durable consumer
                    ]
                ),
                *_lookup(["PLEXUS_INBOX"], consume=False),
            ],
            publish_deny=_ADMIN_DENY,
            subscribe_allow=[own_inbox, f"{p}.*.orch.>", "$SRV.>", f"{p}.*.progress.>", f"{p}.*.ctr.>"],
        )
    if role == "worker":
        # Subjects and keys carry a type as its escaped token (`wire._subjects`): `a_b` is `a_5Fb` there.
        types = [escape_token(t) for t in agent_types] if agent_types else ["*"]
        own_state = [
            *(f"{p}.*.evlog.{t}.>" for t in types),
            # Its agents' timers and reminders (`sched.<type>.<key>.…`), which the server fires.
            *(f"{p}.*.sched.{t}.>" for t in types),
            *(f"$KV.plexus_checkpoints.*.{t}.>" for t in types),
            *(f"$KV.plexus_leases.*.{t}.*" for t in types),
        ]
        # What it serves: `progress.<root>.<type>.<key>`, `stream.<type>.<key>`, registry `<ns>.<type>`.
        served = (
            [f"{p}.*.progress.>", f"{p}.*.stream.>", "$KV.plexus_registry.>"]
            if not agent_types
            else [
                *(f"{p}.*.progress.*.{t}.*" for t in types),
                *(f"{p}.*.stream.{t}.*" for t in types),
                *(f"$KV.plexus_registry.*.{t}" for t in types),
            ]
        )
        stateless = [f"{p}.*.eph.>"] if not agent_types else [f"{p}.*.eph.{t}.*" for t in types]
        return Permissions(
            publish_allow=[
                f"{p}.*.in.>",  # sending to and spawning any type
                f"{p}.*.eph.>",
                f"{p}.*.topic.>",
                f"{p}.*.dlq.>",  # a dead letter's type is the envelope's: refusing it would redeliver forever
                f"{p}.*.ctr.>",
                f"{p}.*.orch.>",  # spawn, finished, crashed
                *served,
                *own_state,
                "$KV.plexus_workers.>",
                "$KV.plexus_subscriptions.>",
                "$O.plexus_artifacts.>",
                replies,
                *_lookup(["PLEXUS_INBOX", "PLEXUS_SCHEDULES"], consume=False),
                *_partition_consumers(p, types),
                *_lookup(
                    [
                        "PLEXUS_EVENTS",
                        "PLEXUS_COUNTERS",
                        "PLEXUS_PROGRESS",
                        "OBJ_plexus_artifacts",
                        kv["checkpoints"],
                        kv["registry"],
                        kv["workers"],
                        kv["leases"],
                        kv["runs"],
                        kv["subscriptions"],
                    ]
                ),
            ],
            publish_deny=[*_ADMIN_DENY, f"{p}.*.ctl.>", "$KV.plexus_runs.>", "$KV.plexus_sessions.>"],
            subscribe_allow=[own_inbox, *stateless, f"{p}.*.topic.>", f"{p}.*.ctl.>"],
        )
    if role == "gateway":
        return Permissions(
            publish_allow=[
                f"{p}.*.in.>",
                f"{p}.*.eph.>",
                f"{p}.*.orch.>",
                "$KV.plexus_sessions.>",
                "$O.plexus_artifacts.>",
                *_lookup(
                    [
                        "PLEXUS_PROGRESS",
                        "PLEXUS_EVENTS",
                        "PLEXUS_COUNTERS",
                        "OBJ_plexus_artifacts",
                        kv["sessions"],
                        kv["registry"],
                        kv["subscriptions"],  # every Runtime follows the topic subscriptions
                        kv["workers"],
                        kv["leases"],
                        kv["runs"],
                        "KV_plexus_gateway_tokens",  # followed, never written: tokens are the operator's
                    ]
                ),
            ],
            publish_deny=[
                *_ADMIN_DENY,
                "$KV.plexus_gateway_tokens.>",
                f"{p}.*.evlog.>",
                "$KV.plexus_checkpoints.>",
                "$KV.plexus_leases.>",
                "$KV.plexus_runs.>",
                f"{p}.*.ctl.>",
            ],
            subscribe_allow=[own_inbox, f"{p}.*.progress.>", f"{p}.*.stream.>", f"{p}.*.ctr.>", _RUN_RECORDS],
        )
    if role == "client":
        return Permissions(
            publish_allow=[
                f"{p}.*.in.>",
                f"{p}.*.eph.>",
                f"{p}.*.orch.>",
                *_lookup(
                    [
                        "PLEXUS_PROGRESS",
                        kv["registry"],
                        kv["workers"],
                        kv["runs"],
                        kv["subscriptions"],
                        kv["leases"],  # `plexus agents`: which worker owns which partition
                    ]
                ),
                # `runs show|watch`: a tree's budget totals, single messages read (no consumer).
                *_lookup(["PLEXUS_COUNTERS"], consume=False),
            ],
            publish_deny=_ADMIN_DENY,
            subscribe_allow=[own_inbox, f"{p}.*.progress.>", f"{p}.*.stream.>", f"{p}.*.ctr.>", _RUN_RECORDS],
        )
    raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
