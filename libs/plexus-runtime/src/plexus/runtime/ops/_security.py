"""`plexus security init`: a nats-server security config (accounts per tenant, a user per role with the
permissions of `_permissions`, bcrypt-hashed passwords, TLS) and one environment file per identity.

Output directory layout::

    nats-security.conf         include it from every node's config (`include "nats-security.conf"`)
    tls/ca.pem                 the CA clients trust (a fresh development CA made with trustme)
    tls/server.pem, server-key.pem, tls/route.pem, route-key.pem
    tls/<tenant>-<identity>.pem/-key.pem   client certificates (with --mtls)
    env/<tenant>/<identity>.env    PLEXUS_NATS_* for that identity (mode 0600: it holds the password)
    env/SYS.env                the system account's user (server monitoring), mode 0600

An identity is a role (``operator``, ``worker`` ...) or a worker group ``worker-<name>``: a pool of workers
with its own user, permitted only its own agent types (`role_permissions` with those types).

Production deployments bring their own CA and certificates; the development CA is for tests and for trying
the secured mode on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._auth import ENV_VARS
from ._permissions import ROLES, Permissions, role_permissions

__all__ = ["SecurityLayout", "add_security_command", "security_init"]

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


@dataclass
class SecurityLayout:
    """What `security_init` wrote: paths, and per tenant and identity (a role, or ``worker-<group>``) the
    user name and env file."""

    directory: Path
    config: Path
    ca: Path | None
    server_cert: Path | None
    server_key: Path | None
    route_cert: Path | None
    route_key: Path | None
    users: dict[str, dict[str, str]] = field(default_factory=dict)  # tenant -> identity -> user
    env_files: dict[str, dict[str, Path]] = field(default_factory=dict)
    #: The system account's user ``sys`` (server monitoring only: no JetStream, no tenant's subjects).
    sys_env: Path | None = None

    def env(self, tenant: str, role: str) -> dict[str, str]:
        """The ``PLEXUS_NATS_*`` variables of one identity (`role`: a role or ``worker-<group>``)."""
        out: dict[str, str] = {}
        for line in self.env_files[tenant][role].read_text().splitlines():
            name, _, value = line.partition("=")
            out[name] = json.loads(value)
        return out


def _check_name(kind: str, name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"{kind} must match {_NAME_RE.pattern}, got {name!r}")
    return name


@dataclass(frozen=True)
class _Identity:
    """One user of a tenant: `key` names its files (a role, or ``worker-<group>``)."""

    key: str
    role: str
    inbox_token: str  # after the tenant's: `_INBOX.<tenant>_<inbox_token>`
    agent_types: list[str] | None = None


def _identities(
    tenant: str, worker_types: list[str] | None, groups: Mapping[str, Sequence[str]]
) -> list[_Identity]:
    out = [_Identity(role, role, role, worker_types if role == "worker" else None) for role in ROLES]
    for group, types in groups.items():
        _check_name("worker group", group)
        if not types:
            raise ValueError(f"worker group {tenant}/{group} has no agent types")
        checked = [_check_name("agent type", t) for t in types]
        # `_<group>` keeps `-` (a token character): groups `a-b` and `a_b` get distinct inboxes.
        out.append(_Identity(f"worker-{group}", "worker", f"worker_{group}", checked))
    return out


def _bcrypt(password: str) -> str:
    import bcrypt

    # nats-server recognises bcrypt hashes by their "$2a$" prefix; "$2b$" is the same algorithm.
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=11)).decode().replace("$2b$", "$2a$", 1)


def _list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _permissions_block(perms: Permissions) -> str:
    publish = f"allow: {_list(perms.publish_allow)}"
    if perms.publish_deny:
        publish += f", deny: {_list(perms.publish_deny)}"
    subscribe = f"allow: {_list(perms.subscribe_allow)}"
    if perms.subscribe_deny:
        subscribe += f", deny: {_list(perms.subscribe_deny)}"
    return f"{{ publish: {{ {publish} }}, subscribe: {{ {subscribe} }} }}"


def security_init(
    directory: Path,
    tenants: list[str],
    *,
    prefix: str = "px",
    hosts: list[str] | None = None,
    tls: bool = True,
    mtls: bool = False,
    worker_types: dict[str, list[str]] | None = None,
    worker_groups: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
    replace: bool = False,
) -> SecurityLayout:
    """Write the files described in the module docstring. `hosts` are the names and addresses in the
    server certificate (default ``127.0.0.1``, ``localhost``); `worker_types` maps a tenant to the agent
    types its ``worker`` user serves (default: any); `worker_groups` maps a tenant to its worker groups,
    each a name and the agent types its own user ``<tenant>-worker-<name>`` serves. A `directory` that
    holds a layout already is a ValueError unless `replace`: new passwords and certificates lock out every
    server and process using the old ones."""
    if not tenants:
        raise ValueError("at least one tenant is needed")
    for tenant in tenants:
        _check_name("tenant", tenant)
        if tenant.upper() == "SYS":
            raise ValueError("SYS is the system account's name")
    if len(set(tenants)) != len(tenants):
        raise ValueError(f"tenants repeat: {tenants}")
    if mtls and not tls:
        raise ValueError("mTLS needs TLS")
    groups = dict(worker_groups or {})
    if unknown := sorted(set(groups) - set(tenants)):
        raise ValueError(f"worker groups of tenants not given with --tenant: {', '.join(unknown)}")
    identities = {t: _identities(t, (worker_types or {}).get(t), groups.get(t, {})) for t in tenants}
    if (directory / "nats-security.conf").exists() and not replace:
        raise ValueError(
            f"{directory} holds a security layout already: writing it again makes new passwords and"
            " certificates, which lock out every server and process using the old ones (--force replaces it)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    layout = SecurityLayout(directory, directory / "nats-security.conf", None, None, None, None, None)
    lines: list[str] = []
    client_certs: dict[tuple[str, str], tuple[Path, Path]] = {}
    if tls:
        import trustme

        tls_dir = directory / "tls"
        tls_dir.mkdir(exist_ok=True)
        ca = trustme.CA()
        layout.ca = tls_dir / "ca.pem"
        ca.cert_pem.write_to_path(str(layout.ca))
        names = hosts or ["127.0.0.1", "localhost"]
        for kind in ("server", "route"):
            # Route certificates serve both ends of a route: trustme's leaf certificates carry both the
            # serverAuth and the clientAuth usage.
            leaf = ca.issue_cert(*names)
            cert, key = tls_dir / f"{kind}.pem", tls_dir / f"{kind}-key.pem"
            leaf.private_key_pem.write_to_path(str(key))
            with cert.open("wb") as out:
                for blob in leaf.cert_chain_pems:
                    out.write(blob.bytes())
            os.chmod(key, 0o600)
            if kind == "server":
                layout.server_cert, layout.server_key = cert, key
            else:
                layout.route_cert, layout.route_key = cert, key
        verify = "\n  verify: true" if mtls else ""
        lines.append(
            "tls {\n"
            f"  cert_file: {json.dumps(str(layout.server_cert))}\n"
            f"  key_file: {json.dumps(str(layout.server_key))}\n"
            f"  ca_file: {json.dumps(str(layout.ca))}{verify}\n"
            "  timeout: 5\n"
            "}"
        )
        if mtls:
            for tenant in tenants:
                for ident in identities[tenant]:
                    name = f"{tenant}-{ident.key}"
                    leaf = ca.issue_cert(f"{name}.plexus.invalid")
                    cert, key = tls_dir / f"{name}.pem", tls_dir / f"{name}-key.pem"
                    leaf.private_key_pem.write_to_path(str(key))
                    leaf.cert_chain_pems[0].write_to_path(str(cert))
                    os.chmod(key, 0o600)
                    client_certs[(tenant, ident.key)] = (cert, key)
    sys_password = secrets.token_urlsafe(24)
    accounts = [f'  SYS {{ users: [ {{ user: "sys", password: {json.dumps(_bcrypt(sys_password))} }} ] }}']
    # The system account's user (server monitoring over `$SYS.REQ.>`, e.g. `nats server list`).
    sys_env = {ENV_VARS["user"]: "sys", ENV_VARS["password"]: sys_password}
    if layout.ca is not None:
        sys_env[ENV_VARS["tls_ca"]] = str(layout.ca)
    layout.sys_env = directory / "env" / "SYS.env"
    layout.sys_env.parent.mkdir(parents=True, exist_ok=True)
    layout.sys_env.write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in sys_env.items()))
    os.chmod(layout.sys_env, 0o600)
    for tenant in tenants:
        users = []
        layout.users[tenant] = {}
        layout.env_files[tenant] = {}
        env_dir = directory / "env" / tenant
        env_dir.mkdir(parents=True, exist_ok=True)
        for ident in identities[tenant]:
            user = f"{tenant}-{ident.key}"
            password = secrets.token_urlsafe(24)
            inbox = f"_INBOX.{tenant.replace('-', '_')}_{ident.inbox_token}"
            perms = role_permissions(ident.role, inbox, prefix, ident.agent_types)
            users.append(
                f"      {{ user: {json.dumps(user)}, password: {json.dumps(_bcrypt(password))},\n"
                f"        permissions: {_permissions_block(perms)} }}"
            )
            env = {ENV_VARS["user"]: user, ENV_VARS["password"]: password, ENV_VARS["inbox_prefix"]: inbox}
            if layout.ca is not None:
                env[ENV_VARS["tls_ca"]] = str(layout.ca)
            if (tenant, ident.key) in client_certs:
                cert, key = client_certs[(tenant, ident.key)]
                env[ENV_VARS["tls_cert"]], env[ENV_VARS["tls_key"]] = str(cert), str(key)
            path = env_dir / f"{ident.key}.env"
            path.write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in env.items()))
            os.chmod(path, 0o600)
            layout.users[tenant][ident.key] = user
            layout.env_files[tenant][ident.key] = path
        accounts.append(
            f"  {tenant} {{\n    jetstream: enabled\n    users: [\n" + "\n".join(users) + "\n    ]\n  }"
        )
    lines.append("system_account: SYS")
    lines.append("accounts {\n" + "\n".join(accounts) + "\n}")
    layout.config.write_text(
        "# Written by `plexus security init`; see docs/security.md.\n" + "\n".join(lines) + "\n"
    )
    os.chmod(layout.config, 0o600)
    return layout


def add_security_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``plexus security init``."""
    security = sub.add_parser("security", help="NATS accounts, per-role users and TLS for a secured cluster")
    verbs = security.add_subparsers(dest="verb", required=True)
    init = verbs.add_parser(
        "init",
        help="write a nats-server security config (accounts per tenant, a user per role, TLS) and an env "
        "file per identity (see docs/security.md)",
    )
    init.add_argument("directory", type=Path)
    init.add_argument(
        "--tenant", action="append", required=True, help="a tenant (its own NATS account); repeat"
    )
    init.add_argument("--prefix", default="px", help="the Plexus subject prefix (default px)")
    init.add_argument(
        "--host", action="append", default=None, help="a name or address in the server certificate; repeat"
    )
    init.add_argument("--no-tls", action="store_true", help="no TLS (not for production)")
    init.add_argument("--mtls", action="store_true", help="servers verify client certificates too")
    init.add_argument(
        "--force",
        action="store_true",
        help="replace a layout the directory holds (new passwords and certificates)",
    )
    init.add_argument(
        "--worker-types",
        action="append",
        default=[],
        metavar="TENANT=TYPE,TYPE",
        help="the agent types a tenant's `worker` user serves and writes the state of (default: any); repeat",
    )
    init.add_argument(
        "--worker-group",
        action="append",
        default=[],
        metavar="[TENANT/]NAME[:TYPE,TYPE]",
        help="a worker pool with its own user (env/<tenant>/worker-NAME.env) permitted only these agent "
        "types (default: the type NAME); TENANT/ is needed with several tenants; repeat",
    )
    init.set_defaults(handler=_init_command)
    perms = verbs.add_parser(
        "permissions",
        help="print one role's permissions, as JSON or as `nsc add user` flags (operator/JWT mode)",
    )
    perms.add_argument("role", choices=ROLES)
    perms.add_argument("--tenant", required=True, help="the tenant (account) the user belongs to")
    perms.add_argument("--prefix", default="px", help="the Plexus subject prefix (default px)")
    perms.add_argument("--worker-types", default=None, metavar="TYPE,TYPE", help="worker: its agent types")
    perms.add_argument(
        "--group", default=None, metavar="NAME", help="worker: a worker group's user (name and inbox)"
    )
    perms.add_argument("--nsc", action="store_true", help="print `nsc add user` flags instead of JSON")
    perms.set_defaults(handler=_permissions_command)


def _permissions_command(args: argparse.Namespace) -> int:
    try:
        tenant = _check_name("tenant", args.tenant)
        names = args.worker_types.split(",") if args.worker_types else None
        types = [_check_name("agent type", t) for t in names] if names else None
        if args.group is not None:
            if args.role != "worker" or not types:
                raise ValueError(
                    "--group is a worker group's: give it with the worker role and --worker-types"
                )
            _check_name("worker group", args.group)
    except ValueError as exc:
        print(f"plexus: error: {exc}", file=sys.stderr)
        return 2
    name = f"{tenant}_{args.role}" + (f"_{args.group}" if args.group else "")
    perms = role_permissions(args.role, f"_INBOX.{name}", args.prefix, types)
    if not args.nsc:
        print(json.dumps(dataclasses.asdict(perms), indent=2))
        return 0
    flags = [f"--name {name}", f"--account {tenant}"]
    for flag, subjects in (
        ("--allow-pub", perms.publish_allow),
        ("--deny-pub", perms.publish_deny),
        ("--allow-sub", perms.subscribe_allow),
        ("--deny-sub", perms.subscribe_deny),
    ):
        if subjects:
            flags.append(f"{flag} '{','.join(subjects)}'")
    print("nsc add user " + " ".join(flags))
    return 0


def _parse_groups(items: list[str], tenants: list[str]) -> dict[str, dict[str, list[str]]]:
    """``--worker-group [TENANT/]NAME[:TYPE,TYPE]`` options as tenant -> group -> types."""
    groups: dict[str, dict[str, list[str]]] = {}
    for item in items:
        head, sep, types = item.partition(":")
        tenant, slash, name = head.rpartition("/")
        if not slash:
            if len(tenants) != 1:
                raise ValueError(
                    f"--worker-group {item!r}: name its tenant (TENANT/NAME) when there are several"
                )
            tenant = tenants[0]
        if sep and not types:
            raise ValueError(f"--worker-group expects [TENANT/]NAME[:TYPE,TYPE], got {item!r}")
        own = groups.setdefault(tenant, {})
        if name in own:
            raise ValueError(f"worker group {tenant}/{name} is given twice")
        own[name] = types.split(",") if sep else [name]
    return groups


def _init_command(args: argparse.Namespace) -> int:
    worker_types: dict[str, list[str]] = {}
    try:
        for item in args.worker_types:
            tenant, sep, types = item.partition("=")
            if not sep or not types:
                raise ValueError(f"--worker-types expects TENANT=TYPE,TYPE, got {item!r}")
            worker_types[tenant] = [_check_name("agent type", t) for t in types.split(",")]
        worker_groups = _parse_groups(args.worker_group, args.tenant)
        layout = security_init(
            args.directory,
            args.tenant,
            prefix=args.prefix,
            hosts=args.host,
            tls=not args.no_tls,
            mtls=args.mtls,
            worker_types=worker_types,
            worker_groups=worker_groups,
            replace=args.force,
        )
    except ValueError as exc:
        print(f"plexus: error: {exc}", file=sys.stderr)
        return 2
    print(f'wrote {layout.config} (add `include "{layout.config.name}"` to every node\'s config)')
    for tenant, files in layout.env_files.items():
        for role, path in files.items():
            print(f"  {tenant}/{role}: {path}")
    print(f"  SYS (server monitoring): {layout.sys_env}")
    first = args.tenant[0]
    print(
        "create the topology once as the operator: "
        f"(set -a; . {layout.env_files[first]['operator']}; plexus topology --replicas 3 --nats URL)"
    )
    return 0
