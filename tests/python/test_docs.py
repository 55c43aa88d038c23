"""Every Python code block of README.md and docs/*.md runs as written, on 1 CPU process and under
torchrun on 2. A block fenced as ```python fragment (a few schedule lines out of a program) is
the only kind skipped, and must say so in its fence."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks():
    found = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path) as f:
            text = f.read()
        for match in FENCE.finditer(text):
            if match.group(1).strip() == "fragment":
                continue
            line = text[:match.start()].count("\n") + 1
            found.append(pytest.param(match.group(2), id=f"{os.path.basename(path)}:{line}"))
    return found


BLOCKS = _blocks()


def _env():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MESHFUSER_PG_TIMEOUT_S="60", MESHFUSER_VALIDATION_TIMEOUT_S="60", CUDA_VISIBLE_DEVICES="")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID", "MESHFUSER_DUMP"):
        env.pop(key, None)
    return env


def test_the_readme_has_runnable_blocks():
    names = [p.id for p in BLOCKS]
    assert sum(name.startswith("README.md") for name in names) >= 3, names


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs_on_one_process(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{code}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"


@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs_on_two_processes(code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                          str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{code}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr[-4000:]}"


def test_every_pass_has_its_test_file():
    # CONTRIBUTING: one text-test file per pass, tests/cpp/passes/test_<pass>.cpp.
    passes = [os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "csrc", "passes", "*.cpp"))]
    passes = [p for p in passes if p != "pipeline"]
    assert "sum_partials" in passes, passes
    missing = [p for p in passes if not os.path.exists(os.path.join(ROOT, "tests", "cpp", "passes", f"test_{p}.cpp"))]
    assert missing == [], missing
