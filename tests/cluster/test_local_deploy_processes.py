"""deploy.local without network namespaces: what `up` prints for its --dir and --app, and `down` / `restart`
signalling a recorded PID only while it is still the process recorded (its start time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deploy.local.__main__ import DEFAULT_DIR, summary
from deploy.local.cluster import APP, LocalCluster
from deploy.local.netns import Network
from deploy.local.processes import alive, same_process, start_time, stop

STATE: dict[str, object] = {
    "nats": ["nats://10.77.0.2:4222"],
    "hosts": {"h1": "10.77.0.2"},
    "dashboard": "http://10.77.0.4:8080/",
    "health": {"gateway": "http://10.77.0.4:8080/readyz"},
}


def test_up_prints_commands_for_its_own_dir_and_app(tmp_path: Path) -> None:
    default = "\n".join(summary(STATE, DEFAULT_DIR, APP))
    assert "stop with `make cluster-down`" in default
    assert "plexus runs start planner/demo" in default
    mine = "\n".join(summary(STATE, tmp_path, "myapp.agents:app"))
    assert "make cluster-down" not in mine
    assert f"stop with `python -m deploy.local down --dir {tmp_path}`" in mine
    assert f"restart NAME --dir {tmp_path}`" in mine
    assert "planner/demo" not in mine
    assert "agent types of myapp.agents:app: plexus agents --nats nats://10.77.0.2:4222" in mine


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_stop_signals_only_the_process_recorded_with_the_pid() -> None:
    recorded, other = _sleeper(), _sleeper()
    try:
        started = start_time(recorded.pid)
        assert started is not None
        assert same_process(recorded.pid, started)
        # `other` holds a PID recorded with another start time: a restarted process, or the PID reused.
        earlier = (start_time(other.pid) or 0) - 1
        gone = stop({"ours": (recorded.pid, started), "reused": (other.pid, earlier)}, grace_s=5)
        assert gone == ["reused"]
        assert recorded.wait(timeout=10) is not None
        assert other.poll() is None
        assert alive(other.pid)
    finally:
        for proc in (recorded, other):
            proc.kill()
            proc.wait()


def test_down_leaves_a_process_that_is_no_longer_the_recorded_one(tmp_path: Path) -> None:
    stranger = _sleeper()
    try:
        started = start_time(stranger.pid)
        assert started is not None
        state = {"pids": {"worker-w1": stranger.pid}, "started": {"worker-w1": started - 1}}
        tmp_path.mkdir(exist_ok=True)
        (tmp_path / "state.json").write_text(json.dumps(state))
        # Its own network name: a real local cluster's ("plx") may be up on this machine.
        LocalCluster(tmp_path, network=Network("pxq", "10.79.0.0/24")).down()
        assert stranger.poll() is None
        assert alive(stranger.pid)
        assert not (tmp_path / "state.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_restart_needs_a_known_service(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"pids": {}, "spawn": {"worker-w1": {}}}))
    done = subprocess.run(
        [sys.executable, "-m", "deploy.local", "restart", "gateway-x", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1
    assert "cannot restart 'gateway-x': the services it can restart are worker-w1" in done.stderr
