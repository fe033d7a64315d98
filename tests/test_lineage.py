"""dvc.yaml lineage: every stage lists, as deps, each project module its command imports.

DVC reruns a stage only when a listed dep changes, so a module a stage imports but does not list
lets an edit to it leave stale outputs that `dvc status` calls up to date. The imports are read with
`ast` (static, nothing is executed) and followed transitively through `selfcest` and `stages`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"selfcest": ROOT / "src", "stages": ROOT}


def module_file(module: str) -> Path | None:
    """The project file of a dotted module name (package -> its __init__.py), None if not ours."""
    top = module.split(".")[0]
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Project modules a file imports (`import a.b`, `from a.b import c`; `c` when it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in found if module_file(m) is not None}


def transitive_files(module: str) -> set[Path]:
    """Files of `module` and every project module it reaches, with their packages' __init__ files."""
    seen: set[Path] = set()
    pending = [module]
    while pending:  # bounded: each project file is visited once
        name = pending.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            path = module_file(".".join(parts[:depth]))
            if path is not None and path not in seen:
                seen.add(path)
                pending.extend(imported_modules(path))
    return seen


def stage_commands() -> list[tuple[str, str, list[str]]]:
    """(stage name, `python -m` module, deps) for every stage of dvc.yaml (foreach/matrix bodies once)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        match = re.search(r"python -m ([\w.]+)", body["cmd"])
        assert match, f"dvc.yaml stage {name}: cmd {body['cmd']!r} is not `python -m <module>`"
        deps = [d if isinstance(d, str) else next(iter(d)) for d in body.get("deps", [])]
        out.append((name, match.group(1), deps))
    return out


# The library's top-level package file holds no code (a docstring and `__version__`); listing it would
# make a version bump rerun every stage. stages/__init__.py (it pins the CPU kernels) and sub-package
# __init__ files (selfcest.data) are required.
INIT_FILES = {ROOT / "src/selfcest/__init__.py"}


@pytest.mark.parametrize(
    ("stage", "module", "deps"), stage_commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_stage_deps_cover_every_project_module_it_imports(stage: str, module: str, deps: list[str]) -> None:
    listed = {(ROOT / d).resolve() for d in deps}
    needed = {p.resolve() for p in transitive_files(module)} - {p.resolve() for p in INIT_FILES}
    missing = sorted(str(p.relative_to(ROOT)) for p in needed - listed)
    assert not missing, f"dvc.yaml stage {stage} imports these but does not list them as deps: {missing}"


def test_lineage_reader_follows_imports_transitively() -> None:
    """The checker itself: stages.evaluate reaches selfcest.scoring only through selfcest.evaluation."""
    files = {str(p.relative_to(ROOT)) for p in transitive_files("stages.evaluate")}
    assert {"stages/evaluate.py", "src/selfcest/evaluation.py", "src/selfcest/scoring.py"} <= files
    assert "src/selfcest/teachers.py" not in files


def test_build_model_lists_the_starting_checkpoints_folder_it_warns_about() -> None:
    """`stages.build_model` warns about a `model.init_from` outside `CHECKPOINTS_DIR` because that
    folder is its DVC dependency; the two must name the same folder."""
    from stages.build_model import CHECKPOINTS_DIR

    [deps] = [deps for name, _, deps in stage_commands() if name == "build_model"]
    assert CHECKPOINTS_DIR.as_posix() in deps
    assert (ROOT / CHECKPOINTS_DIR / "README.md").is_file()
