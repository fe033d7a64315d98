"""The whole pipeline at toy size (`profiles/smoke.yaml`) in a throwaway copy of this working tree.

    python scripts/smoke.py [WORKDIR]        # or: make smoke

It copies the files git knows of (tracked, and untracked ones that are not ignored, so a change
can be smoke-tested before it is committed) to WORKDIR/selfcest, links WORKDIR/shared to this
checkout's `../shared` or `--shared` (`dvc.yaml` names the benchmark files by that relative path), commits the
copy in a git repository of its own, and runs `dvc exp run` there with the smoke overlay's `-S`
overrides: the user's way of running a profile. The real run's artifacts/, reports/ and dvc.lock
are never touched. Afterwards `dvc status` in the copy must be clean; the copy is kept for
inspection (its reports/ and `dvc params diff`).

Why a copy and not `dvc exp run --temp`: DVC runs a temporary experiment in `.dvc/tmp/exps/...`,
where `../shared` does not resolve. This script is outside `src/` because the library knows
nothing of DVC.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = "profiles/smoke.yaml"
SHARED = REPO.parent / "shared"  # dvc.yaml names the benchmarks as ../shared/data/benchmarks


class SmokeError(RuntimeError):
    """A step of the smoke run failed; the message names the step and the copy it ran in."""


STEP_TIMEOUT_S = 1800
"""A step still running after this long is stopped (the whole run takes 4-6 minutes on two cores):
a hung stage would otherwise hold `make smoke` for ever."""


def _run(
    args: list[str], cwd: Path, env: dict[str, str], capture: bool = False, timeout_s: float = STEP_TIMEOUT_S
) -> str:
    # A session of its own, so that a step past its time is stopped with what it started (DVC's
    # stage commands), not dvc alone.
    with subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SmokeError(f"`{' '.join(args)}` was still running in {cwd} after {timeout_s:g} s") from None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if process.returncode != 0:
        detail = f"\n{stdout}\n{stderr}" if capture else ""
        raise SmokeError(f"`{' '.join(args)}` failed in {cwd} (exit status {process.returncode}){detail}")
    return stdout if capture else ""


def copy_working_tree(source: Path, target: Path) -> int:
    """Copy every file git knows of (tracked or untracked-not-ignored, deleted ones left out) from
    `source` to `target`. Returns how many."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        capture_output=True,
    )
    if listing.returncode != 0:
        raise SmokeError(
            f"{source} is not a git checkout (`git ls-files`: {listing.stderr.decode().strip()})"
        )
    listed = listing.stdout.decode()
    copied = 0
    for name in sorted({n for n in listed.split("\0") if n}):
        path = source / name
        if not path.is_file():  # deleted in the working tree, or a submodule
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / name)
        copied += 1
    return copied


def prepare_copy(
    workdir: Path, shared: Path = SHARED, python: str = sys.executable
) -> tuple[Path, dict[str, str]]:
    """`workdir/selfcest`: this working tree's files, committed in a git repository of its own, with
    `workdir/shared` linked to `shared`. Returns the copy and the environment its stages run in."""
    shared = shared.resolve()
    if not (shared / "data" / "benchmarks").is_dir():
        raise SmokeError(
            f"{shared / 'data' / 'benchmarks'} is missing: dvc.yaml reads the benchmarks from there"
        )
    copy, link = workdir / "selfcest", workdir / "shared"
    if copy.exists():
        raise SmokeError(f"{copy} already exists: give an empty or new WORKDIR")
    if link.exists() and link.resolve() != shared:
        raise SmokeError(f"{link} exists and is not {shared}: give an empty or new WORKDIR")
    copy.mkdir(parents=True)
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    print(f"smoke: copied {copy_working_tree(REPO, copy)} files to {copy}", flush=True)

    # The copy's own library, not the editable install's working tree; its interpreter first on
    # PATH, since the stages run `python -m stages...`.
    env = {
        **os.environ,
        "PYTHONPATH": str(copy / "src"),
        "PATH": str(Path(python).parent) + os.pathsep + os.environ.get("PATH", ""),
        "DVC_NO_ANALYTICS": "1",
        # DVC's per-repository site cache of a throwaway repository belongs with it.
        "DVC_SITE_CACHE_DIR": str(workdir / "dvc-site-cache"),
    }
    git = ["git", "-c", "user.email=smoke@selfcest", "-c", "user.name=smoke"]
    _run(["git", "init", "-q"], copy, env)
    _run([*git, "add", "-A"], copy, env)
    _run([*git, "commit", "-q", "-m", "smoke: the working tree"], copy, env)
    return copy, env


def smoke(workdir: Path, shared: Path = SHARED, python: str = sys.executable) -> Path:
    """Run the smoke profile with `dvc exp run` in `prepare_copy`'s copy; return the copy's path."""
    copy, env = prepare_copy(workdir, shared, python)
    overrides = _run(
        [python, "-m", "selfcest.cli", "profile", PROFILE, "--print0"], copy, env, capture=True
    ).split("\0")
    started = time.monotonic()
    _run([python, "-m", "dvc", "exp", "run", *[o for o in overrides if o]], copy, env)
    status = _run([python, "-m", "dvc", "status"], copy, env, capture=True)
    if "up to date" not in status:
        raise SmokeError(f"`dvc status` in {copy} is not clean after the run:\n{status}")
    print(f"smoke: the pipeline ran in {time.monotonic() - started:.0f} s; reports in {copy / 'reports'}")
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", nargs="?", help="where to put the copy (default: a new temporary folder)")
    parser.add_argument(
        "--shared",
        type=Path,
        default=SHARED,
        help="the folder holding data/benchmarks (default: ../shared beside this checkout)",
    )
    args = parser.parse_args(argv)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="selfcest-smoke-"))
    try:
        smoke(workdir.resolve(), args.shared)
    except SmokeError as exc:
        print(f"smoke: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
