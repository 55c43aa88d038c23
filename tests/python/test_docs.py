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


# -- every reference to a document resolves to a file of the repository ------------------------------

SEARCHED = ["csrc", "include", "python", "tests", "tools", "scripts", "benchmarks", "examples", "cmake", "docs",
            "CMakeLists.txt", "README.md", "CONTRIBUTING.md", "pyproject.toml"]
DOC_REF = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-][\w.-]*\.md)\b")
SECTION_REF = re.compile(r"(docs/design\.md),? sections? (\d+)")


def _searched_files():
    for entry in SEARCHED:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for folder, _, files in os.walk(path):
            for name in files:
                if name.endswith((".h", ".cpp", ".py", ".md", ".txt", ".cmake", ".toml", ".sh")) or "." not in name:
                    yield os.path.join(folder, name)


def _doc_references():
    found = []
    for path in _searched_files():
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for match in DOC_REF.finditer(text):
            line = text[:match.start()].count("\n") + 1
            found.append((os.path.relpath(path, ROOT), line, match.group(1)))
    return found


def _resolves(referrer, ref):
    candidates = [os.path.join(ROOT, ref), os.path.join(ROOT, os.path.dirname(referrer), ref),
                  os.path.join(ROOT, "docs", ref)]
    return any(os.path.isfile(c) for c in candidates)


def test_every_document_reference_resolves_to_a_file():
    refs = _doc_references()
    assert any(ref == "docs/design.md" for _, _, ref in refs), "no reference to docs/design.md found: the scan is broken"
    missing = [f"{path}:{line}: {ref}" for path, line, ref in refs if not _resolves(path, ref)]
    assert missing == [], "references to documents that are not in the repository:\n" + "\n".join(missing)


# A path into the workspace folder beside the repository, which a clone does not have (spelled in
# two parts so that this test is not itself such a reference).
OUTSIDE_MARKER = "../" + "shared"


def test_no_reference_leaves_the_repository():
    outside = []
    for path in _searched_files():
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if OUTSIDE_MARKER in text:
            outside.append(os.path.relpath(path, ROOT))
    assert outside == [], outside


def test_design_sections_cited_in_the_code_exist():
    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        sections = set(re.findall(r"^## (\d+)\. ", f.read(), re.M))
    cited = []
    for path in _searched_files():
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        cited += [(os.path.relpath(path, ROOT), number) for _, number in SECTION_REF.findall(text)]
    assert cited, "no 'docs/design.md section N' found: the scan is broken"
    assert [c for c in cited if c[1] not in sections] == [], sorted(sections)


def test_the_reference_scan_finds_a_missing_file():
    missing = "DESIGN" + ".md"  # spelled in two pieces so that this file does not cite it
    assert DOC_REF.findall(f"see {missing} section 4 and docs/design.md") == [missing, "docs/design.md"]
    assert not _resolves("csrc/ir/nodes.h", missing)
    assert _resolves("csrc/ir/nodes.h", "docs/design.md")
