"""Every line of the Python README runs against the installed wheel, in a clean folder.

The README is python/README.md (the top README's "Python" section points to it and repeats
its first example, which is checked too). `pip install` lines are skipped: the wheel under test
is already installed. Lines marked "(needs a display)" run only with $DISPLAY. The recording
example runs as written when torch with CUDA is installed; otherwise it must raise
memsnap.torch.MemsnapError saying what is missing.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
READMES = [HERE.parent / "README.md", HERE.parent.parent / "README.md"]


def blocks(text, language):
    return re.findall(r"```" + language + r"\n(.*?)```", text, re.S)


def python_section(path):
    text = path.read_text()
    if path == READMES[1]:
        match = re.search(r"\n## Python\n(.*?)(\n## |\Z)", text, re.S)
        assert match, "the top README has a Python section"
        return match.group(1)
    return text


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_shell_lines(text, folder):
    ran = 0
    for block in blocks(text, "sh"):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if not command or command.startswith("pip install"):
                continue
            if "needs a display" in line and not os.environ.get("DISPLAY"):
                continue
            subprocess.run(command, shell=True, check=True, cwd=folder, capture_output=True,
                           env=dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"))
            ran += 1
    return ran


@pytest.mark.parametrize("readme", READMES, ids=["python/README.md", "README.md"])
def test_readme_python_section_runs(readme, folder):
    text = python_section(readme)
    assert run_shell_lines(text, folder) >= 1
    assert (folder / "snapshot.pickle").exists()
    for code in blocks(text, "python"):
        namespace = {"train_one_epoch": lambda: None}
        if "memsnap.torch" in code:
            import memsnap.torch

            try:
                exec(compile(code, str(readme), "exec"), namespace)
            except memsnap.torch.MemsnapError as error:
                assert "PyTorch" in str(error) or "CUDA" in str(error)
            continue
        exec(compile(code, str(readme), "exec"), namespace)
    if readme == READMES[0]:
        assert (folder / "copy.pickle").exists()
        assert (folder / "timeline.png").read_bytes().startswith(b"\x89PNG")
