"""``plexus tokens create|ls|revoke``: the gateway's bearer tokens in the tenant's bucket (run it as an
identity that may write ``plexus_gateway_tokens``, e.g. the tenant's operator; every gateway replica picks
the change up while it runs)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from plexus.runtime import Runtime

from ._access import TokenRegistry

__all__ = ["register_tokens"]


def register_tokens(sub: Any, nats_arg: Any, guarded: Any, urls: Any) -> None:
    parser = sub.add_parser("tokens", help="create, list and revoke the gateway's bearer tokens")
    verbs = parser.add_subparsers(dest="tokens_command", required=True)
    create = verbs.add_parser("create", help="a new token (printed once; only its hash is stored)")
    create.add_argument("name", help="what the token is for (unique; used to revoke it)")
    ls = verbs.add_parser("ls", help="token names and creation times (never the tokens)")
    revoke = verbs.add_parser(
        "revoke", help="revoke the token(s) of NAME: every gateway refuses them at once"
    )
    revoke.add_argument("name")
    for verb in (create, ls, revoke):
        nats_arg(verb)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=lambda args: guarded("tokens", _tokens(args, urls(args))))


async def _tokens(args: argparse.Namespace, servers: list[str]) -> int:
    # Through the runtime: in development mode it creates the topology (the tokens bucket with it).
    rt = await Runtime.connect(servers, name="plexus-tokens")
    try:
        registry = TokenRegistry(rt.js)
        if args.tokens_command == "create":
            token = await registry.create(args.name)
            print(token)
            print(
                f"token {args.name!r} created; it is not stored and will not be shown again", file=sys.stderr
            )
            return 0
        if args.tokens_command == "revoke":
            gone = await registry.revoke(args.name)
            if not gone:
                print(f"plexus tokens: error: no token named {args.name!r}", file=sys.stderr)
                return 1
            print(f"revoked {args.name!r}")
            return 0
        records = await registry.list()
        if args.json:
            print(json.dumps([{"name": r.name, "created_at": r.created_at} for r in records]))
        for r in records if not args.json else []:
            created = datetime.datetime.fromtimestamp(r.created_at, datetime.UTC).isoformat(
                timespec="seconds"
            )
            print(f"{r.name}\t{created}")
        return 0
    finally:
        await rt.close()
