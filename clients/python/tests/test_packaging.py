"""The distribution: the wheel and the sdist build (hatchling, via `python -m build`), the
wheel carries py.typed and every module, its metadata names the dependencies and the extras,
and it installs into a fresh venv whose Python imports the installed package (not src/)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
MODULES = {
    "__init__.py",
    "py.typed",
    "_adapter.py",
    "_calls.py",
    "_runner.py",
    "_runner_async.py",
    "_statements.py",
    "aio.py",
    "answers.py",
    "core.py",
    "django.py",
    "errors.py",
    "fastapi.py",
    "outcomes.py",
}


def run(*args: str | Path, cwd: Path = PROJECT) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_wheel_and_sdist_build_and_the_wheel_installs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # --no-isolation: the pinned hatchling of the test venv, no download during the tests.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, PROJECT)
    (wheel,) = dist.glob("tombstoned-0.1.0-py3-none-any.whl")
    (sdist,) = dist.glob("tombstoned-0.1.0.tar.gz")

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = Parser().parsestr(archive.read("tombstoned-0.1.0.dist-info/METADATA").decode())
    assert {f"tombstoned/{m}" for m in MODULES} <= names
    assert not any(n.startswith(("tests/", "tools/")) for n in names)
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("psycopg>=") for r in requires)
    assert any(r.startswith("fastapi") and "extra == 'fastapi'" in r for r in requires)
    assert any(r.lower().startswith("django") and "extra == 'django'" in r for r in requires)
    assert set(metadata.get_all("Provides-Extra") or []) == {"fastapi", "django"}

    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/tombstoned/py.typed"} <= members
    assert "tests/test_packaging.py" in members

    # A fresh venv; its third-party packages are the test venv's (no network here), tombstoned
    # only the wheel's.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    (site,) = venv.glob("lib/python*/site-packages")
    (ours,) = Path(sys.prefix).glob("lib/python*/site-packages")
    (site / "test-venv.pth").write_text(f"{ours}\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "--no-deps",
        "--no-index",
        "--quiet",
        wheel,
    )
    out = run(
        venv / "bin" / "python",
        "-c",
        "import pathlib, tombstoned, tombstoned.fastapi, tombstoned.django;"
        "print(tombstoned.__version__, tombstoned.API_VERSION,"
        " pathlib.Path(tombstoned.__file__).parent,"
        " (pathlib.Path(tombstoned.__file__).parent / 'py.typed').is_file())",
        cwd=tmp_path,
    )
    version, api, where, typed = out.split()
    assert (version, api, typed) == ("0.1.0", "1", "True")
    assert Path(where).is_relative_to(venv), where
