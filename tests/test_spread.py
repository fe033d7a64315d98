"""`selfcest spread`: the headline numbers of several runs side by side, over real git revisions and
a real DVC experiment (`dvc exp run -S seed=43`), as a reviewer compares seeds."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from selfcest.cli import main as cli_main
from selfcest.spread import read_metrics, run_labels, spread_markdown

REPO = Path(__file__).resolve().parents[1]

# A stage that stands in for the pipeline's report: it writes a metrics.json in the shape
# `selfcest.reports.build_metrics` writes (the committed one), with numbers that depend on the seed.
WRITE_METRICS = """\
import json, sys
import yaml

seed = yaml.safe_load(open("params.yaml"))["seed"]
metrics = json.load(open("template.json"))
qa = metrics["benchmarks"]["qa/test"]["methods"]
qa["selfcest"]["accuracy"] = round(0.5 + 0.125 * (seed - 42), 6)
metrics["claims"]["qa/test"]["c"] = int(seed == 43)
metrics["benchmarks"]["arithmetic/ood"]["methods"].pop("thinking") if seed == 43 else None
json.dump(metrics, open("reports/metrics.json", "w"), indent=2)
"""

DVC_YAML = f"""\
stages:
  report:
    cmd: {sys.executable} write_metrics.py
    deps: [write_metrics.py, template.json]
    params: [seed]
    metrics:
      - reports/metrics.json:
          cache: false
"""


def _run(repo: Path, *args: str) -> str:
    return subprocess.run(
        list(args), cwd=repo, capture_output=True, text=True, check=True, timeout=180
    ).stdout


def _git(repo: Path, *args: str) -> str:
    return _run(repo, "git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args)


def _committed_metrics() -> dict:
    return json.loads((REPO / "reports" / "metrics.json").read_text(encoding="utf-8"))


def _row(table: str, section: str, method: str) -> list[str]:
    """The cells of `method`'s row in `section`'s table."""
    body = table.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in body.splitlines() if line.startswith(f"| `{method}` |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_spread_over_a_commit_and_a_dvc_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(tmp_path / "site-cache"))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    # As in the project's params.yaml, a stage's own seed follows the top-level one.
    (repo / "params.yaml").write_text("seed: 42\nreport:\n  seed: ${seed}\n", encoding="utf-8")
    (repo / "write_metrics.py").write_text(WRITE_METRICS, encoding="utf-8")
    shutil.copy(REPO / "reports" / "metrics.json", repo / "template.json")
    (repo / "dvc.yaml").write_text(DVC_YAML, encoding="utf-8")
    _git(repo, "init", "-q")
    _run(repo, sys.executable, "-m", "dvc", "init", "-q")
    _run(repo, sys.executable, "-m", "dvc", "config", "core.analytics", "false")
    _run(repo, sys.executable, "-m", "dvc", "repro", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "seed 42")
    _run(repo, sys.executable, "-m", "dvc", "exp", "run", "-q", "-S", "seed=43", "-n", "seed43")
    refs = _git(repo, "for-each-ref", "refs/exps", "--format=%(refname)").split()
    (experiment,) = [ref for ref in refs if ref.endswith("/seed43")]

    out = tmp_path / "spread.md"
    assert cli_main(["spread", "HEAD", experiment, "--repo", str(repo), "--out", str(out)]) == 0
    table = out.read_text(encoding="utf-8")
    assert table in capsys.readouterr().out
    assert "Runs: `HEAD (seed 42)`, `seed43 (seed 43)`." in table  # a full ref by its last part
    committed = _committed_metrics()["benchmarks"]
    # selfcest on qa/test: 50% in the seed-42 run, 62.5% in the experiment.
    assert _row(table, "qa/test", "selfcest") == ["50.0%", "62.5%", "56.2%", "50.0% - 62.5%"]
    base = committed["qa/test"]["methods"]["base"]["accuracy"]
    assert _row(table, "qa/test", "base") == [f"{base:.1%}"] * 3 + [f"{base:.1%} - {base:.1%}"]
    # A method one run lacks shows as `-` there, and the mean is over the run that has it.
    thinking = committed["arithmetic/ood"]["methods"]["thinking"]["accuracy"]
    assert _row(table, "arithmetic/ood", "thinking") == [
        f"{thinking:.1%}",
        "-",
        f"{thinking:.1%}",
        f"{thinking:.1%} - {thinking:.1%}",
    ]
    claim_c = next(line for line in table.splitlines() if line.startswith("| (c)") and "`qa/test`" in line)
    assert claim_c.endswith("| 0 | 1 | 1 of 2 |")
    # The experiment's results are also in the working tree after `dvc exp run`.
    assert cli_main(["spread", "HEAD", "workspace", "--repo", str(repo)]) == 0
    assert _row(capsys.readouterr().out, "qa/test", "selfcest") == [
        "50.0%",
        "62.5%",
        "56.2%",
        "50.0% - 62.5%",
    ]
    # `dvc exp run -S` writes `${seed}` resolved, so a second `-S seed=44` on that working tree
    # leaves the stage's seed at 43, and the label says so; restoring params.yaml first (the
    # README's workflow) gives a run of one seed.
    exp = (sys.executable, "-m", "dvc", "exp", "run", "-q")
    _run(repo, *exp, "-S", "seed=44", "-n", "seed44mixed")
    _git(repo, "checkout", "--", "params.yaml")
    _run(repo, *exp, "-S", "seed=44", "-n", "seed44")
    refs = _git(repo, "for-each-ref", "refs/exps", "--format=%(refname)").split()
    runs = [next(ref for ref in refs if ref.endswith(f"/{name}")) for name in ("seed44mixed", "seed44")]
    assert cli_main(["spread", "HEAD", *runs, "--repo", str(repo)]) == 0
    assert (
        "Runs: `HEAD (seed 42)`, `seed44mixed (seeds 44, 43)`, `seed44 (seed 44)`." in capsys.readouterr().out
    )


def test_spread_names_a_missing_revision_and_refuses_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["spread", "HEAD", "no-such-revision", "--repo", str(REPO)]) == 2
    error = capsys.readouterr().err
    assert "no-such-revision" in error and "reports/metrics.json" in error
    assert cli_main(["spread", "HEAD", "HEAD", "--repo", str(REPO)]) == 2
    assert "given twice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least two runs"):
        spread_markdown({"a": _committed_metrics()})


def test_spread_refuses_runs_whose_reference_budgets_differ() -> None:
    metrics = _committed_metrics()
    other = json.loads(json.dumps(metrics))
    budget = metrics["benchmarks"]["qa/test"]["reference_budget"]
    other["benchmarks"]["qa/test"]["reference_budget"] = budget * 2
    with pytest.raises(ValueError, match=rf"qa/test.*old: {budget}, new: {budget * 2}"):
        spread_markdown({"old": metrics, "new": other})


def test_read_metrics_names_the_source_and_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="run1:reports/metrics.json: not JSON"):
        read_metrics("{", "run1:reports/metrics.json")
    with pytest.raises(ValueError, match="run1:m.json: no 'benchmarks' mapping"):
        read_metrics('{"claims": {}}', "run1:m.json")
    with pytest.raises(ValueError, match="benchmark 'qa/test' has no integer 'reference_budget'"):
        read_metrics('{"benchmarks": {"qa/test": {"methods": {}}}}', "run1:m.json")
    with pytest.raises(ValueError, match="'claims' is not a mapping"):
        read_metrics('{"benchmarks": {}, "claims": {"qa/test": 1}}', "run1:m.json")
    # a verdict of 2 counted as two runs held, "yes" and true stopped int() without the file's name;
    # a method without a numeric accuracy stopped the table with a TypeError or AttributeError
    for verdict in (2, "yes", True, None):
        with pytest.raises(ValueError, match="run1:m.json: 'claims' is not a mapping"):
            read_metrics(json.dumps({"benchmarks": {}, "claims": {"qa/test": {"c": verdict}}}), "run1:m.json")
    for entry in (0.5, {"accuracy": "0.5"}, {"accuracy": None}):
        bench = {"qa/test": {"reference_budget": 128, "methods": {"base": entry}}}
        with pytest.raises(
            ValueError,
            match="run1:m.json: benchmark 'qa/test', method 'base' is not a mapping with a numeric",
        ):
            read_metrics(json.dumps({"benchmarks": bench}), "run1:m.json")
    no_problems = {"qa/test": {"reference_budget": 128, "methods": {"base": {"auc": 0.1}}}}
    assert read_metrics(json.dumps({"benchmarks": no_problems}), "x")  # accuracy left out: fine
    assert read_metrics(json.dumps(_committed_metrics()), "x") == _committed_metrics()


def test_run_labels_name_the_seed_and_the_working_tree() -> None:
    with pytest.raises(ValueError, match=r"two runs would share the label workspace \(seed 42\)"):
        run_labels([None, ""], [[42], [42]])
    assert run_labels(["HEAD", None, "abc", "refs/exps/b2/9e1f/seed44"], [[42], [43], [], [44, 43]]) == [
        "HEAD (seed 42)",
        "workspace (seed 43)",
        "abc",
        "seed44 (seeds 44, 43)",
    ]
    with pytest.raises(ValueError, match="given twice: HEAD"):
        run_labels(["HEAD", "HEAD"], [[], []])
    # DVC keeps experiment names unique per baseline only: two baselines' seed43 are two runs
    twins = ["refs/exps/b2/9e1f377/seed43", "refs/exps/61/9038aa1/seed43", "refs/exps/61/9038aa1/seed44"]
    assert run_labels(twins, [[43], [43], [44]]) == [
        "seed43@b29e1f3 (seed 43)",
        "seed43@619038a (seed 43)",
        "seed44 (seed 44)",
    ]
    # a branch and an experiment with one name keep their whole revisions
    assert run_labels(["seed43", "refs/exps/b2/9e1f377/seed43"], [[43], [43]]) == [
        "seed43 (seed 43)",
        "refs/exps/b2/9e1f377/seed43 (seed 43)",
    ]


def test_spread_names_a_claims_caveat_row_and_counts_it_over_the_runs_where_the_claim_held() -> None:
    """metrics.json's `<claim>_weak` (1: the claim held only with a caveat, such as a gap within
    noise; absent where it did not hold) was printed as a bare `a_weak` row under "1 holds, 0 does
    not", so `a_weak ... 0 of 2` read as a claim that failed in both runs when it held cleanly."""
    clean, caveat, failed = (json.loads(json.dumps(_committed_metrics())) for _ in range(3))
    clean["claims"]["qa/test"] |= {"a": 1, "a_weak": 0}
    caveat["claims"]["qa/test"] |= {"a": 1, "a_weak": 1}
    failed["claims"]["qa/test"]["a"] = 0
    failed["claims"]["qa/test"].pop("a_weak", None)
    table = spread_markdown({"clean": clean, "caveat": caveat, "failed": failed})
    [row] = [
        line
        for line in table.splitlines()
        if line.startswith("| (a)") and "caveat" in line and "qa/test" in line
    ]
    assert row.endswith("| `qa/test` | 0 | 1 | - | 1 of 2 held with a caveat |")
    assert "a_weak" not in table


def _with_paired(metrics: dict, **counts: tuple[int, int, int]) -> dict:
    """A copy of `metrics` whose `paired` holds claim (c)'s (budget, for, against) per benchmark
    (`arithmetic_ood=...`), or no `paired` at all without counts (a run from before the key)."""
    copy = json.loads(json.dumps(metrics))
    copy.pop("paired", None)
    if counts:
        copy["paired"] = {
            name.replace("_", "/", 1): {"c": {"budget": b, "for": w, "against": lo}}
            for name, (b, w, lo) in counts.items()
        }
    return copy


def test_spread_pools_claim_c_sign_tests_over_the_runs_that_kept_them() -> None:
    """Seed 42's 8 for / 10 against and seed 43's 25 / 4 are one exact test of 33 against 14; a run
    whose metrics.json predates `paired` is shown as `-` and left out, not counted as 0 / 0."""
    metrics = _committed_metrics()
    runs = {
        "s42": _with_paired(metrics, arithmetic_ood=(256, 8, 10)),
        "old": _with_paired(metrics),
        "s43": _with_paired(metrics, arithmetic_ood=(256, 25, 4), qa_test=(128, 0, 0)),
    }
    table = spread_markdown(runs)
    section = table.split("## Claim (c) pooled over the runs", 1)[1]
    [arith] = [line for line in section.splitlines() if "`arithmetic/ood` at 256" in line]
    p_value = 2 * sum(math.comb(47, i) for i in range(15)) / 2**47
    assert (
        arith
        == f"| (c) selfcest beats prompted | `arithmetic/ood` at 256 | 8 / 10 | - | 25 / 4 | 33 / 14 over 2 runs | {p_value:.3g} |"
    )
    [qa] = [line for line in section.splitlines() if "`qa/test` at 128" in line]
    assert qa.endswith("| - | - | 0 / 0 | 0 / 0 over 1 run | 1 |")
    # no run with counts: no section
    assert "pooled" not in spread_markdown({"a": _with_paired(metrics), "b": _with_paired(metrics)})
    # counts taken at different budgets are not one test
    with pytest.raises(ValueError, match=r"arithmetic/ood: claim \(c\)'s paired counts .*a: 256, b: 512"):
        spread_markdown(
            {
                "a": _with_paired(metrics, arithmetic_ood=(256, 1, 0)),
                "b": _with_paired(metrics, arithmetic_ood=(512, 1, 0)),
            }
        )
    # a malformed entry is named with its run
    bad = _with_paired(metrics, arithmetic_ood=(256, 1, 0))
    bad["paired"]["arithmetic/ood"]["c"]["for"] = -1
    with pytest.raises(ValueError, match=r"run1:m.json: paired\['arithmetic/ood'\]\['c'\] is not"):
        read_metrics(json.dumps(bad), "run1:m.json")


def test_spread_reads_runs_kept_as_metrics_files_with_their_params_beside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run recorded outside git's history (docs/seed_runs/) is given as its metrics file: named by
    its folder, its seed read from the params.yaml beside it; two folders of one name keep their paths."""
    metrics = _committed_metrics()
    paths = []
    for folder, seed, counts in (("a/seed43", 43, (256, 25, 4)), ("b/seed43", 44, (256, 11, 13))):
        run = tmp_path / folder
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(
            json.dumps(_with_paired(metrics, arithmetic_ood=counts)), encoding="utf-8"
        )
        (run / "params.yaml").write_text(f"seed: {seed}\n", encoding="utf-8")
        paths.append(str(run / "metrics.json"))
    assert cli_main(["spread", "HEAD", paths[0], "--repo", str(REPO)]) == 0
    table = capsys.readouterr().out
    assert "Runs: `HEAD (seed 42)`, `seed43 (seed 43)`." in table
    assert cli_main(["spread", *paths]) == 0
    table, errors = capsys.readouterr()
    assert f"Runs: `{paths[0]} (seed 43)`, `{paths[1]} (seed 44)`." in table
    assert "note: the pooled test assumes independent runs" not in errors  # seeds 43 and 44
    assert cli_main(["spread", "HEAD", "workspace", paths[0], "--repo", str(REPO)]) == 0
    assert "these share their seeds: HEAD (seed 42) and workspace (seed 42)" in capsys.readouterr().err
    assert "| 25 / 4 | 11 / 13 | 36 / 17 over 2 runs |" in table
    # a malformed file is named by its path
    Path(paths[1]).write_text("{", encoding="utf-8")
    assert cli_main(["spread", *paths]) == 2
    assert f"{paths[1]}: not JSON" in capsys.readouterr().err


def test_spread_refuses_one_run_under_two_names_and_names_files_apart_from_git_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pooling counts a run once: a file spelt two ways, or a branch and the commit it points at,
    is refused. A file whose folder is named like a git run (a branch, `workspace`) keeps its path;
    a `.json` argument that is neither a file nor a revision says so."""
    metrics = _committed_metrics()
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    (repo / "reports" / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "run")
    _git(repo, "branch", "seed43")
    for folder in ("runs/seed43", "runs/workspace"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    common = ["--repo", str(repo)]
    assert cli_main(["spread", "runs/seed43/metrics.json", "./runs/seed43/metrics.json", *common]) == 2
    assert "the same run given twice: runs/seed43/metrics.json and ./runs/seed43/metrics.json" in (
        capsys.readouterr().err
    )
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert cli_main(["spread", "seed43", head, *common]) == 2
    assert f"the same run given twice: seed43 and {head}" in capsys.readouterr().err
    # `workspace` reads the working tree's metrics file: that file by its path is the same run
    assert cli_main(["spread", "workspace", str(repo / "reports" / "metrics.json"), *common]) == 2
    assert "the same run given twice: workspace and " in capsys.readouterr().err
    files = ["runs/seed43/metrics.json", "runs/workspace/metrics.json"]
    assert cli_main(["spread", "seed43", *files, *common]) == 0
    assert (
        "Runs: `seed43`, `runs/seed43/metrics.json`, `runs/workspace/metrics.json`."
        in capsys.readouterr().out
    )
    assert cli_main(["spread", "seed43", "runs/nope/metrics.json", *common]) == 2
    assert "runs/nope/metrics.json: no such metrics file (relative to" in capsys.readouterr().err
    # a metrics file in the current folder has no folder name: it was labelled `workspace`, and
    # given beside the working tree's own run the two pooled as one
    monkeypatch.chdir(tmp_path / "runs" / "seed43")
    assert cli_main(["spread", "workspace", "metrics.json", *common]) == 0
    assert "Runs: `workspace`, `metrics.json`." in capsys.readouterr().out
    # a paired count away from the benchmark's reference budget is refused where the file is read
    off = _with_paired(metrics, arithmetic_ood=(512, 1, 0))
    with pytest.raises(
        ValueError, match=r"paired\['arithmetic/ood'\]\['c'\] is at budget 512: not its reference"
    ):
        read_metrics(json.dumps(off), "m.json")
    stray = _with_paired(metrics, arithmetic_ood=(256, 1, 0))
    stray["paired"]["math/aime24"] = stray["paired"].pop("arithmetic/ood")
    with pytest.raises(ValueError, match="at budget 256: no such benchmark"):
        read_metrics(json.dumps(stray), "m.json")
