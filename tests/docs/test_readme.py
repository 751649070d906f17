"""README.md's minimal app works as written: its taste saved as `myapp.py` with the script the README adds,
run by the README's own `plexus dev ... --once` line, answers with the scripted model's reply."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from tests.docs.test_quickstart import _env

README = Path(__file__).resolve().parents[2] / "README.md"
PYTHON = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_minimal_app_runs_under_plexus_dev(tmp_path: Path) -> None:
    text = README.read_text()
    taste, script = PYTHON.findall(text)[:2]
    assert "saved as `myapp.py`" in text
    (tmp_path / "myapp.py").write_text(f"{taste}\n\n{script}")
    lines = text.splitlines()
    [command] = [line.split("#")[0].strip() for line in lines if line.startswith("plexus dev myapp")]
    done = subprocess.run(
        shlex.split(command),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 words." in done.stdout.splitlines(), done.stdout[-3000:]
