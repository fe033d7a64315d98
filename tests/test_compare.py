"""Reviewing a change across commits: `dvc metrics diff` and `dvc plots diff` on the project's own
dvc.yaml and reports, in a real git + DVC repository, and `selfcest compare`, their offline stand-in
for the plots (DVC's HTML loads Vega from a CDN)."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from selfcest.cli import main as cli_main
from selfcest.compare import changes_markdown, read_sweep_csv, sweep_changes

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args], cwd=repo, check=True
    )


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def _moved(accuracy: float) -> float:
    """The accuracy a rerun moved by 25 points, within [0, 1] whatever the committed value (a
    committed 100% must still move)."""
    return round(accuracy + 0.25 if accuracy <= 0.75 else accuracy - 0.25, 6)


def _set_accuracy(repo: Path, bench: str, method: str, accuracy: float) -> None:
    """What a rerun that moved one method on one benchmark writes: its sweep rows and metrics."""
    dataset, split = bench.split("/")
    path = repo / "reports" / "sweep.csv"
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if (row["dataset"], row["split"], row["method"]) == (dataset, split, method):
            row["accuracy"] = str(accuracy)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    metrics_path = repo / "reports" / "metrics.json"
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    metrics["benchmarks"][bench]["methods"][method]["accuracy"] = accuracy
    metrics_path.write_text(json.dumps(metrics, indent=2), encoding="utf-8")


@pytest.fixture
def reviewed_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, float]:
    """A git + DVC repository with the project's dvc.yaml, params, plot template and committed
    reports, then a second commit in which `selfcest` on qa/test moved. Returns it and the old
    accuracy."""
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    repo = tmp_path / "repo"
    (repo / "stages").mkdir(parents=True)
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, repo / name)
    shutil.copy(REPO / "stages" / "pareto_plot.json", repo / "stages" / "pareto_plot.json")
    shutil.copytree(REPO / "reports", repo / "reports")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _dvc(repo, "init", "-q")
    _dvc(repo, "config", "core.analytics", "false")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first run")
    metrics = json.loads((repo / "reports" / "metrics.json").read_text(encoding="utf-8"))
    old = metrics["benchmarks"]["qa/test"]["methods"]["selfcest"]["accuracy"]
    _set_accuracy(repo, "qa/test", "selfcest", _moved(old))
    _git(repo, "commit", "-qam", "second run")
    return repo, old


def test_dvc_metrics_diff_shows_the_one_metric_that_changed(reviewed_repo: tuple[Path, float]) -> None:
    repo, old = reviewed_repo
    diff = json.loads(_dvc(repo, "metrics", "diff", "HEAD~1", "HEAD", "--json").stdout)
    assert diff["reports/metrics.json"] == {
        "benchmarks.qa/test.methods.selfcest.accuracy": {
            "old": old,
            "new": _moved(old),
            "diff": pytest.approx(_moved(old) - old),
        }
    }


def test_dvc_plots_diff_draws_both_revisions_of_every_cost(reviewed_repo: tuple[Path, float]) -> None:
    repo, old = reviewed_repo
    data = json.loads(_dvc(repo, "plots", "diff", "HEAD~1", "HEAD", "--json", "--split").stdout)["data"]
    new = _moved(old)
    for plot in (
        "accuracy_vs_generated_tokens",
        "accuracy_vs_total_tokens",
        "accuracy_vs_critical_path_tokens",
    ):
        [entry] = data[plot]
        assert entry["revisions"] == ["HEAD~1", "HEAD"]
        assert '"field": "rev"' in json.dumps(entry["content"])  # the template tells the revisions apart
        points = entry["anchor_definitions"]["<DVC_METRIC_DATA>"]
        moved = {
            p["rev"]: float(p["accuracy"])
            for p in points
            if (p["benchmark"], p["method"]) == ("qa/test", "selfcest")
        }
        assert moved == {"HEAD~1": pytest.approx(old), "HEAD": pytest.approx(new)}
        unmoved = [p for p in points if (p["benchmark"], p["method"]) == ("qa/test", "base")]
        assert {p["rev"] for p in unmoved} == {"HEAD~1", "HEAD"}
        by_rev = {
            rev: sorted((p["budget"], p["accuracy"]) for p in unmoved if p["rev"] == rev) for rev in moved
        }
        assert by_rev["HEAD~1"] == by_rev["HEAD"]  # what did not change is drawn the same twice


def test_selfcest_compare_lists_the_changed_cells_and_draws_static_plots(
    reviewed_repo: tuple[Path, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, old = reviewed_repo
    out = tmp_path / "diff"
    assert cli_main(["compare", "HEAD~1", "HEAD", "--repo", str(repo), "--out", str(out)]) == 0
    table = (out / "changes.md").read_text(encoding="utf-8")
    assert table in capsys.readouterr().out
    cells = [line for line in table.splitlines() if line.startswith("| qa/test")]
    budgets = sorted(
        {
            int(r["budget"])
            for r in csv.DictReader((repo / "reports/sweep.csv").open())
            if r["dataset"] == "qa"
        }
    )
    assert [line.split(" | ")[1:3] for line in cells] == [["`selfcest`", str(b)] for b in budgets]
    assert all(f"-> {_moved(old):.1%}" in line and line.endswith("| accuracy |") for line in cells)
    assert f"{len(budgets)} changed, 0 added, 0 removed." in table
    for cost in ("gen_tokens", "total_tokens", "critical_tokens"):
        png = (out / f"accuracy_vs_{cost}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    # The working tree against HEAD: nothing changed, and the table says so.
    assert cli_main(["compare", "HEAD", "--repo", str(repo), "--out", str(out)]) == 0
    assert "No cell changed." in (out / "changes.md").read_text(encoding="utf-8")
    # `workspace` names the working tree on either side, as in `selfcest spread`
    assert cli_main(["compare", "workspace", "HEAD~1", "--repo", str(repo), "--out", str(out)]) == 0
    backwards = (out / "changes.md").read_text(encoding="utf-8")
    assert f"{len(budgets)} changed, 0 added, 0 removed." in backwards and f"-> {old:.1%}" in backwards


def test_selfcest_compare_of_two_empty_sweeps_writes_the_table_and_no_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "old.csv").write_text(SWEEP.splitlines()[0] + "\n", encoding="utf-8")
    shutil.copy(tmp_path / "old.csv", tmp_path / "sweep.csv")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "sweep.csv")
    _git(tmp_path, "commit", "-q", "-m", "empty sweep")
    out = tmp_path / "diff"
    assert (
        cli_main(["compare", "HEAD", "--repo", str(tmp_path), "--sweep", "sweep.csv", "--out", str(out)]) == 0
    )
    assert "No cell changed." in (out / "changes.md").read_text(encoding="utf-8")
    assert "no plots" in capsys.readouterr().out and not list(out.glob("*.png"))


def test_selfcest_compare_names_a_missing_revision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["compare", "no-such-revision", "--repo", str(REPO), "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "no-such-revision" in error and "reports/sweep.csv" in error
    assert not (tmp_path / "changes.md").exists()


def test_selfcest_compare_names_an_out_path_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An --out that is a file stopped with a FileExistsError traceback."""
    taken = tmp_path / "outfile"
    taken.write_text("mine\n", encoding="utf-8")
    assert cli_main(["compare", "HEAD", "workspace", "--repo", str(REPO), "--out", str(taken)]) == 2
    assert f"error: --out {taken}: " in capsys.readouterr().err
    assert taken.read_text(encoding="utf-8") == "mine\n"


SWEEP = """\
dataset,split,method,checkpoint,budget,n,accuracy,f1,gen_tokens,total_tokens,critical_tokens,seconds,clones
qa,test,base,warmup_model,64,48,0.5,0.6,14.0,300.0,14.0,0.01,0.0
qa,test,selfcest,selfcest_model,64,48,0.625,,48.8,500.0,30.1,0.02,2.0
"""


def test_read_sweep_csv_types_columns_and_names_bad_input() -> None:
    rows = read_sweep_csv(SWEEP, "HEAD:reports/sweep.csv")
    assert rows[0]["benchmark"] == "qa/test" and rows[0]["budget"] == 64 and rows[0]["n"] == 48
    assert rows[1]["accuracy"] == 0.625 and math.isnan(rows[1]["f1"])
    with pytest.raises(ValueError, match=r"HEAD:reports/sweep.csv, line 3, column 'gen_tokens': 'many'"):
        read_sweep_csv(SWEEP.replace("48.8", "many"), "HEAD:reports/sweep.csv")
    with pytest.raises(ValueError, match=r"old.csv: missing column\(s\) \['accuracy'\]"):
        read_sweep_csv(SWEEP.replace(",accuracy,", ",acc,"), "old.csv")
    # a blank line does not shift the line named (the file's line 4 here), and short or long rows are refused
    blank = SWEEP.replace("\nqa,test,selfcest", "\n\nqa,test,selfcest").replace("48.8", "many")
    with pytest.raises(ValueError, match=r"x.csv, line 4, column 'gen_tokens': 'many'"):
        read_sweep_csv(blank, "x.csv")
    with pytest.raises(ValueError, match=r"x.csv, line 3: 11 fields where the header has 13"):
        read_sweep_csv(SWEEP.replace(",0.02,2.0", ""), "x.csv")
    with pytest.raises(ValueError, match=r"x.csv, line 2: 14 fields where the header has 13"):
        read_sweep_csv(SWEEP.replace("0.01,0.0", "0.01,0.0,7"), "x.csv")
    repeated = SWEEP + SWEEP.splitlines()[1] + "\n"
    with pytest.raises(ValueError, match=r"x.csv, line 4: cell \('qa/test', 'base', 64\) repeats line 2"):
        read_sweep_csv(repeated, "x.csv")


def test_sweep_changes_ignore_wall_clock_and_rounding_and_report_added_and_removed_cells() -> None:
    old = read_sweep_csv(SWEEP, "old")
    new = read_sweep_csv(
        SWEEP.replace("0.01,0.0", "0.09,0.0").replace("0.625", "0.6250001").replace("qa,test,base,warmup_model,64", "qa,test,base,warmup_model,128"),
        "new",
    )  # fmt: skip
    changes = sweep_changes(old, new)
    assert [(c["benchmark"], c["method"], c["budget"], c["status"]) for c in changes] == [
        ("qa/test", "base", 128, "added"),
        ("qa/test", "base", 64, "removed"),
    ]  # selfcest's 6e-8 and base's seconds are not changes
    moved = read_sweep_csv(SWEEP.replace("0.625,,48.8", "0.75,,40.0"), "new")
    [change] = sweep_changes(old, moved)
    assert change["status"] == "changed" and change["columns"] == ["accuracy", "gen_tokens"]
    line = changes_markdown([change], "a", "b").splitlines()[-3]
    assert line.startswith(
        "| qa/test | `selfcest` | 64 | changed | 48 | 62.5% -> 75.0% | - | 48.8 -> 40.0 | 500.0 |"
    )
    # F1 and n are compared, so they are shown too: a change in them is never a row of equal values
    f1_and_n = read_sweep_csv(SWEEP.replace("64,48,0.5,0.6,", "64,50,0.5,0.8,"), "new")
    [change] = sweep_changes(old, f1_and_n)
    assert change["columns"] == ["n", "f1"]
    line = changes_markdown([change], "a", "b").splitlines()[-3]
    assert line.startswith("| qa/test | `base` | 64 | changed | 48 -> 50 | 50.0% | 0.600 -> 0.800 | 14.0 |")


def test_a_change_smaller_than_the_tables_rounding_still_shows_both_values() -> None:
    """Two runs' `total_tokens` 190.0625 and 190.104167 (the committed sweeps of a77b09f and
    c121c33, `arithmetic/test` `selfcest-nogate` at 128) both print as 190.1: the row listed
    `total_tokens` as changed but showed one value, as if nothing had moved."""
    old = read_sweep_csv(SWEEP.replace("500.0", "190.0625"), "old")
    new = read_sweep_csv(SWEEP.replace("500.0", "190.104167"), "new")
    [change] = sweep_changes(old, new)
    assert change["columns"] == ["total_tokens"]
    line = changes_markdown([change], "a", "b").splitlines()[-3]
    assert line.startswith(
        "| qa/test | `selfcest` | 64 | changed | 48 | 62.5% | - | 48.8 | 190.0625 -> 190.104167 |"
    )


def test_plot_revisions_draws_any_number_of_runs(tmp_path: Path) -> None:
    """Its three dashed styles were zipped strictly with the runs' labels: five runs stopped with
    "zip() argument 2 is shorter than argument 1"."""
    from selfcest.compare import plot_revisions

    rows = read_sweep_csv(SWEEP, "run")
    for count in (1, 2, 5):
        path = tmp_path / f"runs{count}.png"
        plot_revisions({f"run{i}": rows for i in range(count)}, "gen_tokens", path)
        assert path.read_bytes().startswith(PNG_MAGIC)
