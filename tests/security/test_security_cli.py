"""`plexus security init` and the `PLEXUS_NATS_*` settings: what they write; clear errors for bad input."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from plexus.runtime.cli import main
from plexus.runtime.kernel import NatsAuth
from plexus.runtime.ops._auth import NatsAuthError

REPO = Path(__file__).resolve().parents[2]


def test_init_writes_a_config_and_private_env_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sec"
    assert (
        main(["security", "init", str(out), "--tenant", "acme", "--mtls", "--worker-types", "acme=ledger"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "create the topology once as the operator" in printed
    config = (out / "nats-security.conf").read_text()
    assert "system_account: SYS" in config
    assert "acme {" in config
    assert "verify: true" in config  # mTLS
    assert '"$KV.plexus_checkpoints.*.ledger.>"' in config
    assert 'password: "$2a$' in config  # bcrypt at rest, never the plain password
    env = (out / "env" / "acme" / "worker.env").read_text()
    assert "PLEXUS_NATS_PASSWORD=" in env
    password = env.split("PLEXUS_NATS_PASSWORD=", 1)[1].splitlines()[0].strip('"')
    assert password not in config
    for secret in (
        out / "nats-security.conf",
        out / "env" / "acme" / "worker.env",
        out / "tls" / "server-key.pem",
    ):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert (out / "tls" / "acme-worker.pem").exists()  # a client certificate per identity


def test_init_never_replaces_a_layout_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second init into the same directory would write new passwords and certificates and lock a running
    cluster's servers and processes out; it is refused with one line, and `--force` replaces the layout."""
    out = tmp_path / "sec"
    assert main(["security", "init", str(out), "--tenant", "acme"]) == 0
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["security", "init", str(out), "--tenant", "acme"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plexus: error: "), err
    assert "--force" in err, err
    assert len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == kept
    assert main(["security", "init", str(out), "--tenant", "acme", "--force"]) == 0
    worker_env = out / "env" / "acme" / "worker.env"
    assert worker_env.read_bytes() != kept[worker_env]  # a new password


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "SYS"], "SYS is the system account's name"),
        (["--tenant", "a b"], "tenant must match"),
        (["--tenant", "acme", "--tenant", "acme"], "tenants repeat"),
        (["--tenant", "acme", "--worker-types", "acme"], "--worker-types expects TENANT=TYPE,TYPE"),
        (["--tenant", "acme", "--no-tls", "--mtls"], "mTLS needs TLS"),
    ],
)
def test_init_refuses_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["security", "init", str(tmp_path / "sec"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plexus: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PLEXUS_NATS_PASSWORD": "x"}, "a password needs a user"),
        ({"PLEXUS_NATS_TLS_CA": "/nonexistent/ca.pem"}, "no such file"),
        ({"PLEXUS_NATS_INBOX_PREFIX": "replies.>"}, "inbox prefix must look like _INBOX.<name>"),
        ({"PLEXUS_NATS_USER": "u", "PLEXUS_NATS_CREDS": __file__}, "either a credentials file or a user"),
    ],
)
def test_bad_connection_settings_are_refused_before_connecting(env: dict[str, str], message: str) -> None:
    with pytest.raises(NatsAuthError, match=message.replace(".", r"\.").replace("<", ".").replace(">", ".")):
        NatsAuth.from_env(env)
    # A command reading them says so in one line and exits 2 (no traceback, no connection attempt).
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_NATS")}
    done = subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", "types", "--nats", "nats://127.0.0.1:1"],
        env={**clean, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_permissions_prints_a_role_for_operator_jwt_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """Operator/JWT (nsc) deployments give each user the same permissions as `security init` does."""
    import json

    from plexus.runtime.ops._permissions import role_permissions

    assert main(["security", "permissions", "worker", "--tenant", "acme", "--worker-types", "ledger"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = role_permissions("worker", "_INBOX.acme_worker", "px", ["ledger"])
    assert printed["publish_allow"] == expected.publish_allow
    assert "$KV.plexus_checkpoints.*.ledger.>" in printed["publish_allow"]
    assert main(["security", "permissions", "client", "--tenant", "acme", "--nsc"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("nsc add user --name acme_client --account acme --allow-pub 'px.*.in.>,")
    assert "--allow-sub '_INBOX.acme_client.>" in line
    assert main(["security", "permissions", "client", "--tenant", "bad tenant!"]) == 2
    assert "tenant" in capsys.readouterr().err
