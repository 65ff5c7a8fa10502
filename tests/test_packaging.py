"""The wheel: `pip wheel .` builds one that carries the bundled examples, py.typed and the command, at the version
written in one place (tritongrad.__version__), and that installs into a fresh virtual environment where the command runs
on the installed package (torch and the other dependencies come from this environment: nothing is downloaded)."""

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tritongrad

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources a wheel needs, so that the build leaves nothing in the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT / "tritongrad", source / "tritongrad", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"))
    (found,) = (tmp / "dist").glob("tritongrad-*.whl")
    return found


def test_the_wheel_carries_every_module_and_example_at_the_one_version(wheel):
    assert wheel.name.startswith(f"tritongrad-{tritongrad.__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"tritongrad-{tritongrad.__version__}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tritongrad").rglob("*.py")}
    assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    from tritongrad.examples import NAMES

    assert {f"tritongrad/examples/{n}.py" for n in NAMES} <= names
    assert "tritongrad/py.typed" in names  # PEP 561: the package's annotations are for type checkers
    assert f"\nVersion: {tritongrad.__version__}\n" in metadata
    assert "tritongrad = tritongrad.tools.cli:main" in entry_points


@pytest.mark.slow  # (seconds: with the slow tests, CI's second command)
def test_the_wheel_installs_into_a_fresh_environment_and_its_command_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel))
    # torch, triton, numpy and rich from this environment, after the fresh one's own site-packages (a path in a .pth
    # file is added without running that folder's .pth files: an editable install of tritongrad there stays off)
    own = _run(str(python), "-c", "import site; print(site.getsitepackages()[0])").stdout.strip()
    Path(own, "_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.update(CUDA_VISIBLE_DEVICES="", COLUMNS="160")
    where = _run(str(python), "-c", "import tritongrad.examples.sin, tritongrad; print(tritongrad.__file__)",
                 cwd=tmp_path, env=env).stdout.strip()
    assert Path(where).is_relative_to(venv), where
    command = venv / "bin" / "tritongrad"
    version = _run(str(command), "--version", cwd=tmp_path, env=env).stdout.strip()
    assert version == f"tritongrad {tritongrad.__version__}"
    checked = _run(str(command), "check", "sin", "swiglu", cwd=tmp_path, env=env).stdout
    assert "all 10 ok" in checked, checked
