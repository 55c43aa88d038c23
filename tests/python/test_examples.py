"""The Python examples run (one process here; the multi-rank tests cover the same blocks sharded)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_gpt_block_example_matches_pytorch(form):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # one process: rank 0 of 1
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "gpt_block.py"), "--form", form, "--seq", "8",
                          "--head-dim", "8"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    match = re.search(r"max \|error\| vs PyTorch ([0-9.e+-]+)", run.stdout)
    assert match, run.stdout
    assert float(match.group(1)) < 1e-4, run.stdout
