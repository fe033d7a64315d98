"""The Prefect flow runs real DVC stages in order in a real git + DVC repo, and DVC decides reruns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.pipeline import REPO_ROOT, pipeline, stage_order

DVC_YAML = """\
stages:
  second:
    cmd: python -c "import pathlib; pathlib.Path('b.txt').write_text(pathlib.Path('a.txt').read_text() + 'b')"
    deps: [a.txt]
    outs: [b.txt]
  first:
    cmd: python -c "import pathlib, yaml, selfcest; print('step 1/3\\rstep 2/3\\rstep 3/3'); pathlib.Path('a.txt').write_text(str(yaml.safe_load(open('params.yaml'))['n']))"
    params: [n]
    outs: [a.txt]
"""


@pytest.fixture
def dvc_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    # The venv's bin/ off PATH, as for `.venv/bin/python flows/pipeline.py` without an activated venv:
    # the stage's `python -c "import selfcest"` works only if the flow puts this interpreter first itself.
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv(
        "PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    )
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], cwd=repo, check=True)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "params.yaml").write_text("n: 1\n")
    return repo


def test_stage_order_follows_dependencies(dvc_repo: Path) -> None:
    assert stage_order(dvc_repo) == ["first", "second"]
    assert stage_order(dvc_repo, ["first"]) == ["first"]
    for wrong in (["frist"], []):  # a typo or nothing at all never runs nothing and reports success
        with pytest.raises(ValueError, match="has no stage or stage group"):
            stage_order(dvc_repo, wrong)


def test_stage_order_leaves_out_the_stages_of_dvc_files(dvc_repo: Path) -> None:
    """A `.dvc` file (`dvc add`, or `dvc import-url` into data/sources/ as the README advises) puts
    a nameless stage into DVC's graph; the flow orders the dvc.yaml stages as before."""
    (dvc_repo / "source.txt").write_text("raw\n")
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", "source.txt"], cwd=dvc_repo, check=True)
    assert (dvc_repo / "source.txt.dvc").exists()
    assert stage_order(dvc_repo) == ["first", "second"]
    assert stage_order(dvc_repo, ["second"]) == ["first", "second"]


def test_a_subfolder_of_the_repo_is_refused_by_name(dvc_repo: Path) -> None:
    """DVC finds the repository above a subfolder, but `dvc repro` there fails: refused up front."""
    (dvc_repo / "sub").mkdir()
    with pytest.raises(ValueError, match="not its root") as refused:
        stage_order(dvc_repo / "sub")
    assert str(dvc_repo / "sub") in str(refused.value) and f"--repo {dvc_repo}" in str(refused.value)


def test_a_stages_crlf_lines_and_final_progress_state_are_kept(
    dvc_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line ending "\\r\\n", or a progress bar's last refresh ending "\\r" before the newline,
    keeps its text (the task's own code, without a Prefect run: its logger is a plain one)."""
    import logging

    import flows.pipeline as module

    (dvc_repo / "emit.py").write_text(
        "import sys\n"
        "sys.stdout.write('step 1/3\\rstep 3/3\\r\\nwindows line\\r\\n')\n"
        "open('a.txt', 'w').write('1')\n"
    )
    (dvc_repo / "dvc.yaml").write_text("stages:\n  first:\n    cmd: python emit.py\n    outs: [a.txt]\n")
    monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test_flow"))
    lines = module.repro_stage.fn("first", str(dvc_repo)).splitlines()
    assert "step 3/3" in lines and "windows line" in lines and "step 1/3" not in lines


def test_a_stage_past_its_time_limit_is_stopped_with_what_it_started(
    dvc_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung stage blocked the flow (and every scheduled run behind it) for ever, and its process
    outlived the flow. With a limit, the stage's whole process group is stopped and the task fails."""
    import logging

    import flows.pipeline as module

    (dvc_repo / "hang.py").write_text(
        "import os, pathlib, time\npathlib.Path('pid').write_text(str(os.getpid()))\ntime.sleep(600)\n"
    )
    (dvc_repo / "dvc.yaml").write_text("stages:\n  hang:\n    cmd: python hang.py\n    outs: [never.txt]\n")
    monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test_flow"))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"dvc repro hang was still running after 8 s and was stopped"):
        module.repro_stage.fn("hang", str(dvc_repo), timeout_s=8)
    assert time.monotonic() - started < 60
    # the stage's own process, below dvc, is gone (dead: no process, or a zombie left to be reaped)
    stat = Path("/proc") / (dvc_repo / "pid").read_text() / "stat"

    def running() -> bool:
        try:
            return stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while running():
        assert time.monotonic() < deadline, "the stage's process outlived the stopped stage"
        time.sleep(0.2)
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys, "argv", ["pipeline.py", "--stage-timeout", "0", "--repo", str(dvc_repo)])
        module.main()


def test_a_bad_cron_is_a_usage_error(dvc_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.pipeline as module

    monkeypatch.setattr(module.pipeline, "serve", lambda **kwargs: pytest.fail("served"))
    monkeypatch.setattr(sys, "argv", ["pipeline.py", "--serve", "--cron", "bogus", "--repo", str(dvc_repo)])
    api = {PREFECT_API_URL: "http://127.0.0.1:4200/api"}
    with temporary_settings(updates=api), pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 2
    assert "--cron 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("serve", [False, True])
def test_a_mistyped_stage_or_repo_is_a_usage_error_before_any_flow_runs(
    dvc_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, serve: bool
) -> None:
    """`--stages buildmodel` used to start Prefect's temporary server, record a failed flow run and
    print two tracebacks; now it stops with status 2 and the stage groups, as `--cron bogus` does."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.pipeline as module

    monkeypatch.setattr(module, "pipeline", _never_run)
    flags = ["--serve", "--interval", "60"] if serve else []
    for repo, stages, expected in (
        (dvc_repo, ["buildmodel"], "has no stage or stage group ['buildmodel']"),
        (tmp_path / "nowhere", ["build_model"], f"--repo {tmp_path / 'nowhere'}: "),
    ):
        repo.mkdir(exist_ok=True)
        monkeypatch.setattr(sys, "argv", ["pipeline.py", *flags, "--repo", str(repo), "--stages", *stages])
        api = {PREFECT_API_URL: "http://127.0.0.1:4200/api"}
        with temporary_settings(updates=api), pytest.raises(SystemExit) as exited:
            module.main()
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


class _NeverRun:
    def __call__(self, **kwargs: Any) -> None:
        pytest.fail("the flow ran")

    def serve(self, **kwargs: Any) -> None:
        pytest.fail("the flow was served")


_never_run = _NeverRun()


def test_serving_needs_a_prefect_server_and_runs_one_flow_run_at_a_time(
    dvc_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.pipeline as module

    served: dict[str, Any] = {}
    monkeypatch.setattr(module.pipeline, "serve", lambda **kwargs: served.update(kwargs))
    monkeypatch.chdir(dvc_repo.parent)
    monkeypatch.setattr(sys, "argv", ["pipeline.py", "--serve", "--interval", "60", "--repo", dvc_repo.name])
    with temporary_settings(updates={PREFECT_API_URL: None}), pytest.raises(SystemExit):
        module.main()  # the ephemeral API never fires a schedule: refused, nothing served
    assert not served
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        module.main()
    assert served["limit"] == 1
    assert served["parameters"] == {"repo_dir": str(dvc_repo), "stages": None, "stage_timeout_s": None}


def test_stage_groups_select_every_cell_of_a_foreach_stage() -> None:
    grpo = stage_order(REPO_ROOT, ["train_grpo"])
    assert [s for s in grpo if s.startswith("train_grpo@")] == [
        "train_grpo@noclone",
        "train_grpo@selfcest",
        "train_grpo@selfcest_nogate",
    ]
    assert grpo.index("warmup") < grpo.index("train_grpo@selfcest") and not any("eval" in s for s in grpo)


@pytest.fixture
def prefect_api() -> Iterator[None]:
    """Prefect's temporary API server for this test only. Flows otherwise start an ephemeral server
    that stops at interpreter exit, after pytest has closed the streams its log handler writes to
    ("Logging error ... I/O operation on closed file" at the end of every run)."""
    from prefect.testing.utilities import prefect_test_harness

    # None: wait up to PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (90 s, conftest.py), not 30.
    with prefect_test_harness(server_startup_timeout=None):
        yield


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_flow_runs_stages_and_dvc_skips_unchanged(dvc_repo: Path) -> None:
    outputs = pipeline(repo_dir=str(dvc_repo))
    assert (dvc_repo / "b.txt").read_text() == "1b"
    assert "Running stage 'first'" in outputs["first"]
    # a progress bar's refreshes ("\r") are one line: its last state
    lines = outputs["first"].splitlines()
    assert "step 3/3" in lines and not {"step 1/3", "step 2/3"} & set(lines)
    outputs = pipeline(repo_dir=str(dvc_repo))
    assert "didn't change" in outputs["first"] and "didn't change" in outputs["second"]
    (dvc_repo / "params.yaml").write_text("n: 2\n")
    pipeline(repo_dir=str(dvc_repo))
    assert (dvc_repo / "b.txt").read_text() == "2b"


def _wait_for(condition, what: str, timeout: float, *processes: subprocess.Popen) -> Any:
    """Poll `condition` until it returns something truthy; fail early if a process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            assert process.poll() is None, (
                f"{process.args[:4]} exited with {process.returncode} while waiting for {what}"
            )
        value = condition()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_a_served_deployment_runs_on_its_schedule_on_a_real_prefect_server(
    dvc_repo: Path, tmp_path: Path, port: int
) -> None:
    """`flows/pipeline.py --serve` against `prefect server start` on loopback: the deployment is
    registered with its schedule, the server's scheduler creates a run, the served process picks it
    up and the run executes the DVC stages (schedules never fire on the ephemeral API)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = f"http://127.0.0.1:{port}/api"
    base_env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),  # its own database
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
    }
    base_env.pop("PREFECT_API_URL", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    server_log = open(logs / "server.log", "w")  # noqa: SIM115 (closed in finally)
    serve_log = open(logs / "serve.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=base_env,
        stdout=server_log,
        stderr=subprocess.STDOUT,
    )
    served = None
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        _wait_for(healthy, "the Prefect server", 120, server)
        # The flow anchors interval schedules on round times, so a 20-second interval is due within
        # 20 s; the test watches the first scheduled run only (later ones may start before the end).
        served = subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "flows" / "pipeline.py"),
                "--serve",
                "--interval",
                "20",
                "--name",
                "interval-test",
                "--repo",
                str(dvc_repo),
            ],
            cwd=REPO_ROOT,
            env={**base_env, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "2"},
            stdout=serve_log,
            stderr=subprocess.STDOUT,
        )
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:

            def deployment() -> Any:
                try:
                    return client.read_deployment_by_name("selfcest-pipeline/interval-test")
                except Exception:  # not registered yet
                    return None

            registered = _wait_for(deployment, "the deployment", 120, server, served)
            assert registered.parameters == {
                "repo_dir": str(dvc_repo),
                "stages": None,
                "stage_timeout_s": None,
            }
            assert [s.schedule.interval.total_seconds() for s in registered.schedules] == [20]
            assert registered.schedules[0].schedule.anchor_date.year == 2020  # round times, not serve time
            only_ours = DeploymentFilter(id=DeploymentFilterId(any_=[registered.id]))

            def first_run_ended() -> Any:
                runs = client.read_flow_runs(deployment_filter=only_ours)
                first = min(runs, key=lambda r: r.expected_start_time, default=None)
                return first if first is not None and first.state and first.state.is_final() else None

            run = _wait_for(first_run_ended, "the first scheduled run to end", 240, server, served)
            assert run.state.is_completed(), f"flow run {run.name} ended {run.state.name}"
            assert run.auto_scheduled  # created by the server's scheduler, not by this test
        assert (dvc_repo / "b.txt").read_text() == "1b"  # the run executed both DVC stages
    except AssertionError:
        for log in (server_log, serve_log):
            log.flush()
        print((logs / "serve.log").read_text()[-4000:], (logs / "server.log").read_text()[-2000:])
        raise
    finally:
        for process in (served, server):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        server_log.close()
        serve_log.close()
