"""`selfcest` command line: try any local checkpoint on a question in one line, or compare the
budget sweeps of two commits offline.

selfcest solve --model artifacts/selfcest_model "Calculate the value of 12+7-3."
selfcest compare HEAD~1            # reports/sweep.csv at HEAD~1 against the working tree's
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `solve` imports torch; `compare` should start without it
    from selfcest.runtime import AgentRecord, Episode


def _tree_lines(episode: Episode, root_turn_tokens: int | None = None) -> list[str]:
    """One line per agent, indented by depth. `root_turn_tokens`: the cap on each root turn
    (`RuntimeConfig.root_max_tokens`), shown beside the root's budget, which is the whole episode's:
    a root truncated at its turn cap otherwise read as if cut at the episode budget."""
    lines: list[str] = []

    def visit(agent: AgentRecord, indent: int) -> None:
        pad = "  " * indent
        task = agent.task.replace("\n", " ")
        limits = f"max_tokens={agent.max_tokens}"
        if agent.role == "root" and root_turn_tokens is not None:
            limits = f"budget={agent.max_tokens} turn_max_tokens={root_turn_tokens}"
        lines.append(
            f"{pad}{agent.agent_id} [{agent.status}] gen={agent.generated_tokens} prompt={agent.prompt_tokens} "
            f"{limits} answer={agent.answer!r}"
        )
        if agent.role == "clone":
            lines.append(f"{pad}  task: {task[:120]}")
            if agent.context_keys:
                lines.append(f"{pad}  context: {', '.join(agent.context_keys)}")
        for spawned in agent.children:
            for child in spawned:
                visit(episode.agents[child], indent + 1)

    visit(episode.root, 0)
    return lines


def _usable_device(name: str) -> str | None:
    """`--device` as torch takes it: `auto` as the evaluation cells read it (`eval.sweep.device`:
    CUDA where there is a GPU, else the CPU); None, with the error printed, for a name torch does not
    know or a GPU this machine lacks (they failed deep in torch, with a traceback)."""
    import torch

    from selfcest.engine import resolve_device

    name = resolve_device(name)
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        print(f"error: --device {name}: {exc}", file=sys.stderr)
        return None
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {name}: this machine has no CUDA GPU (--device cpu or auto)", file=sys.stderr)
        return None
    return name


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum` (a negative budget ran, and stopped on
    an internal assertion)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value

    return parse


def cmd_solve(args: argparse.Namespace) -> int:
    from selfcest.determinism import pin_cpu_kernels

    # Before torch is imported: the pipeline's CPU kernels, so that a checkpoint answers here as it
    # does in the evaluation cells (selfcest/determinism.py).
    pin_cpu_kernels()
    from selfcest import engine
    from selfcest.engine import SamplingConfig
    from selfcest.model import load_model
    from selfcest.runtime import Runtime, RuntimeConfig, Task
    from selfcest.tasks import qa_task
    from selfcest.tokenizer import load_tokenizer

    model_dir = Path(args.model)
    if not model_dir.is_dir():  # else transformers reports a failed hub download for a typo
        print(
            f"error: --model {args.model}: no such checkpoint directory (a local path only)", file=sys.stderr
        )
        return 2
    # A folder without a model's configuration or tokenizer (`models/`, a run folder above its
    # checkpoints) failed deep in transformers, asking for sentencepiece or tiktoken.
    # Any one tokenizer file will do: checkpoints ship different sets of them.
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    lacking = [] if (model_dir / "config.json").is_file() else ["config.json"]
    if not any((model_dir / name).is_file() for name in tokenizer_files):
        lacking.append("tokenizer file: " + ", ".join(tokenizer_files))
    if lacking:
        print(
            f"error: --model {args.model}: not a checkpoint directory (no {'; no '.join(lacking)}); "
            "the pipeline writes them under artifacts/ (`make repro`)",
            file=sys.stderr,
        )
        return 2
    documents: dict[str, str] = {}
    if args.documents:
        try:
            documents = json.loads(Path(args.documents).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 text
            print(f"error: --documents {args.documents}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(documents, dict):
            print(
                f"error: {args.documents} must hold a JSON object mapping keys to paragraph text",
                file=sys.stderr,
            )
            return 2
        not_text = [key for key, value in documents.items() if not isinstance(value, str)]
        if not_text:
            print(
                f"error: {args.documents}: the paragraph of key {not_text[0]!r} is not text", file=sys.stderr
            )
            return 2
    device = _usable_device(args.device)
    if device is None:
        return 2
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, device=device)
    config = RuntimeConfig(
        use_tools=not args.no_tools,
        episode_token_budget=args.budget,
        # As `Evaluator.config_for`: a monolithic model (`base`) may spend the whole budget.
        root_max_tokens=args.root_max_tokens
        if args.root_max_tokens is not None
        else (args.budget if args.no_tools else RuntimeConfig.root_max_tokens),
        clone_max_tokens=args.clone_max_tokens,
        max_depth=args.max_depth,
        expression_halves=not args.no_halves,
        expression_max_depth=args.halves_max_depth,
    )
    # As the evaluation builds its tasks: a delegating root sees the paragraphs' keys only, a
    # monolithic reader every paragraph in its prompt.
    if documents:
        task = qa_task("cli", args.question, documents, "delegate" if config.use_tools else "monolithic")
    else:
        task = Task("cli", args.question)
    runtime = Runtime(engine.TransformersEngine(model, tokenizer), config)
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed)
    [episode] = runtime.run([task], sampling=sampling)
    if args.json:
        print(json.dumps(episode.to_dict(), indent=2))
        return 0
    print(f"answer: {episode.final_answer}")
    print(
        f"tokens: generated={episode.generated_tokens} total={episode.total_tokens} "
        f"critical_path={episode.critical_path_tokens} budget={episode.budget} "
        f"clones={episode.num_clones} protocol_errors={len(episode.protocol_errors)} "
        f"seconds={episode.wall_seconds:.2f}"
    )
    print("tree:")
    for line in _tree_lines(episode, root_turn_tokens=config.root_max_tokens):
        print("  " + line)
    if args.verbose:
        for agent in episode.agents:
            print(f"--- {agent.agent_id}")
            print(tokenizer.decode(agent.token_ids))
    return 0


def read_revision(repo: Path, revision: str | None, path: str) -> str:
    """A file's text at a git revision (`git show REV:./path`, so `path` is relative to `repo`), or
    the working tree's copy when `revision` is None. Reports in `reports/` are tracked by git
    (`cache: false` in dvc.yaml), so every commit holds its own."""
    if revision is None:
        file = repo / path
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such file in the working tree")
        return file.read_text(encoding="utf-8")
    result = subprocess.run(
        ["git", "-C", str(repo), "show", f"{revision}:./{path}"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise FileNotFoundError(f"git revision {revision!r} has no {path} in {repo}: {result.stderr.strip()}")
    return result.stdout


def cmd_compare(args: argparse.Namespace) -> int:
    from selfcest.compare import changes_markdown, plot_revisions, read_sweep_csv, sweep_changes
    from selfcest.reports import COSTS

    repo = Path(args.repo)
    labels = [args.old, args.new or "workspace"]
    if labels[0] == labels[1]:  # refused before git is asked for anything
        print(f"error: both sides are {labels[0]!r}", file=sys.stderr)
        return 2
    revisions = [None if label == "workspace" else label for label in labels]  # as `selfcest spread`
    try:
        runs = {
            label: read_sweep_csv(read_revision(repo, revision, args.sweep), f"{label}:{args.sweep}")
            for label, revision in zip(labels, revisions, strict=True)
        }
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    table = changes_markdown(sweep_changes(*runs.values()), *labels)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "changes.md").write_text(table, encoding="utf-8")
    except OSError as error:  # a file where the folder should be, a folder it may not write
        print(f"error: --out {args.out}: {error}", file=sys.stderr)
        return 2
    print(table)
    if not any(runs.values()):  # two header-only sweeps: nothing to draw
        print("no rows in either sweep: no plots")
        return 0
    for cost in COSTS:
        plot_revisions(runs, cost, out / f"accuracy_vs_{cost}.png")
    print(f"plots: {', '.join(str(out / f'accuracy_vs_{cost}.png') for cost in COSTS)}")
    return 0


def _seeds_at(repo: Path, revision: str | None, params: str) -> list[int]:
    """The distinct integer values of every `seed` key in the params file at `revision` (YAML 1.2,
    as DVC reads it), top level first; none when the revision has no such file. They only label the
    run, but more than one shows a run whose stages did not share its seed: `dvc exp run -S seed=N`
    writes `${seed}` resolved, so a second `-S seed=M` on that workspace changes the top-level seed
    alone."""
    try:
        text = read_revision(repo, revision, params)
    except FileNotFoundError:
        return []
    return _seeds_in(text, f"{revision or 'workspace'}:{params}")


def _seeds_in(text: str, source: str) -> list[int]:
    """`_seeds_at`'s values from a params file's text; none when it is not YAML."""
    from selfcest.profiles import ProfileError, read_yaml

    try:
        values = read_yaml(text, source)
    except ProfileError:
        return []
    seeds: list[int] = []
    pending = [values]
    while pending:  # breadth first: the top-level seed before the stages' own
        node = pending.pop(0)
        if isinstance(node, dict):
            seed = node.get("seed")
            if isinstance(seed, int) and not isinstance(seed, bool) and seed not in seeds:
                seeds.append(seed)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return seeds


def _commit_of(repo: Path, revision: str) -> str | None:
    """The commit a git revision names in `repo`, or None when it names none."""
    result = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None if result.returncode == 0 else None


def _spread_files(repo: Path, arguments: Sequence[str]) -> dict[str, Path]:
    """The runs given as metrics files: arguments ending in `.json` that name a file (relative to
    the current directory, since such records live outside git's history; a file shadows a
    revision of the same name). One that names neither a file nor a revision is a FileNotFoundError
    that says so, instead of git's complaint about an unknown revision."""
    files = {}
    for argument in arguments:
        if argument.endswith(".json"):
            if Path(argument).is_file():
                files[argument] = Path(argument)
            elif _commit_of(repo, argument) is None:
                raise FileNotFoundError(
                    f"{argument}: no such metrics file (relative to {Path.cwd()}) and no git revision in {repo}"
                )
    return files


def _refuse_repeated_runs(
    repo: Path, arguments: Sequence[str], files: Mapping[str, Path], metrics: str
) -> None:
    """The same run under two names (a path spelt twice, a branch and its commit, `workspace` and
    the path of its metrics file) would count its sign tests twice in the pooled test: a ValueError
    naming both."""
    seen: dict[tuple[str, str], str] = {}
    for argument in arguments:
        if argument in files:
            key = ("file", str(files[argument].resolve()))
        elif argument == "workspace":  # the working tree's `metrics` file, as a path would name it
            key = ("file", str((repo / metrics).resolve()))
        else:
            key = ("commit", _commit_of(repo, argument) or argument)
        if key in seen:
            raise ValueError(f"the same run given twice: {seen[key]} and {argument}")
        seen[key] = argument


def cmd_spread(args: argparse.Namespace) -> int:
    from selfcest.spread import read_metrics, run_labels, short_ref, spread_markdown

    repo = Path(args.repo)
    revisions = [None if rev == "workspace" else rev for rev in args.revisions]
    try:
        # A run given as a metrics file (a record of a run kept outside git's history, such as
        # docs/seed_runs/): its seed labels come from a params.yaml beside it.
        files = _spread_files(repo, args.revisions)
        _refuse_repeated_runs(repo, args.revisions, files, args.metrics)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def seeds(rev: str | None) -> list[int]:
        if rev in files:
            beside = files[rev].parent / Path(args.params).name
            return _seeds_in(beside.read_text(encoding="utf-8"), str(beside)) if beside.is_file() else []
        return _seeds_at(repo, rev, args.params)

    def metrics_text(rev: str | None) -> str:
        return (
            files[rev].read_text(encoding="utf-8") if rev in files else read_revision(repo, rev, args.metrics)
        )

    # A file's run is named by its folder (`seed43`), or by its path where another run (a branch,
    # an experiment's short name, `workspace`, another file's folder) has that name.
    git_revisions = [rev for rev in revisions if rev not in files]
    git_names = {short_ref(rev, git_revisions) if rev else "workspace" for rev in git_revisions} | {
        "workspace"
    }
    folders = [path.parent.name for path in files.values()]
    names = [
        files[rev].parent.name
        if rev in files
        and files[rev].parent.name  # `metrics.json` in this folder: no folder name, its path
        and files[rev].parent.name not in git_names
        and folders.count(files[rev].parent.name) == 1
        else rev
        for rev in revisions
    ]
    try:
        run_seeds = [seeds(rev) for rev in revisions]
        labels = run_labels(names, run_seeds)
        runs = {
            label: read_metrics(metrics_text(rev), rev if rev in files else f"{label}:{args.metrics}")
            for label, rev in zip(labels, revisions, strict=True)
        }
        table = spread_markdown(runs)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    shared = [
        f"{labels[i]} and {labels[j]}"
        for i in range(len(labels))
        for j in range(i + 1, len(labels))
        if run_seeds[i] and run_seeds[i] == run_seeds[j]
    ]
    if shared and "## Claim (c) pooled" in table:
        # Two commits at one seed are the usual review; their pooled test is not independent.
        print(
            f"note: the pooled test assumes independent runs, and these share their seeds: {'; '.join(shared)}",
            file=sys.stderr,
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table, encoding="utf-8")
    print(table)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from selfcest.profiles import ProfileError, dvc_set_args, load_profile, profile_overrides

    try:
        params = load_profile(args.params)
        overrides = profile_overrides(load_profile(args.profile), params, args.set, str(args.params))
    except (OSError, ProfileError) as exc:
        print(f"selfcest profile: {exc}", file=sys.stderr)
        return 2
    if args.print0:
        sys.stdout.write("".join(f"-S\0{override}\0" for override in overrides))
    else:
        print(dvc_set_args(overrides))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="selfcest", description="SELFCEST: learned delegation by clones")
    commands = parser.add_subparsers(dest="command", required=True)
    solve = commands.add_parser("solve", help="run one episode on a local checkpoint and print the tree")
    solve.add_argument("question")
    solve.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    solve.add_argument("--documents", help="JSON file {key: paragraph} handed to clones by key")
    solve.add_argument("--budget", type=_count(1), default=1024, help="tree-wide generated-token budget")
    solve.add_argument(
        "--root-max-tokens",
        type=_count(1),
        default=None,
        help="the root's own token cap (default: the runtime's 160; with --no-tools, --budget)",
    )
    solve.add_argument("--clone-max-tokens", type=_count(1), default=96)
    solve.add_argument("--max-depth", type=_count(0), default=1)
    solve.add_argument("--no-tools", action="store_true", help="monolithic: no spawn_clone tool")
    solve.add_argument(
        "--no-halves",
        action="store_true",
        help="do not offer a sum's `first half` / `second half` to clones by key (params.yaml's "
        "runtime.expression_halves, on in the default pipeline)",
    )
    solve.add_argument(
        "--halves-max-depth",
        type=_count(0),
        default=3,
        help="the tree depth of an episode that hands halves (runtime.expression_max_depth)",
    )
    solve.add_argument("--temperature", type=float, default=0.0)
    solve.add_argument("--seed", type=int, default=0)
    solve.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:1, ... or auto (a GPU where there is one)"
    )
    solve.add_argument("--json", action="store_true", help="print the whole episode record as JSON")
    solve.add_argument("--verbose", action="store_true", help="print every agent's full context")
    compare = commands.add_parser(
        "compare",
        help="what changed in reports/sweep.csv between two git revisions: a table and static plots "
        "(the offline stand-in for `dvc plots diff`, whose HTML needs a CDN)",
    )
    compare.add_argument(
        "old", help="a git revision, e.g. HEAD~1, main or a commit; `workspace` is the working tree's file"
    )
    compare.add_argument("new", nargs="?", help="a git revision or `workspace` (the default)")
    compare.add_argument("--repo", default=".", help="the repository (default: the current directory)")
    compare.add_argument("--sweep", default="reports/sweep.csv", help="the sweep's path in the repository")
    compare.add_argument("--out", default="reports-diff", help="where changes.md and the PNGs go")
    spread = commands.add_parser(
        "spread",
        help="how reports/metrics.json spreads over several runs (seeds, machines, commits): each "
        "method's accuracy at the reference budget per run, mean and range, and each claim's verdicts",
    )
    spread.add_argument(
        "revisions",
        nargs="+",
        help="two or more runs: git revisions (a commit, a branch, a DVC experiment's ref from "
        "`git for-each-ref refs/exps`), `workspace` (the working tree's file), or a metrics file "
        "(a path ending in .json, relative to the current directory, which shadows a revision of that "
        "name; its seed is read from a params.yaml beside it; e.g. docs/seed_runs/)",
    )
    spread.add_argument("--repo", default=".", help="the repository (default: the current directory)")
    spread.add_argument(
        "--metrics", default="reports/metrics.json", help="the metrics file's path in the repository"
    )
    spread.add_argument("--params", default="params.yaml", help="read for each run's seed (its label)")
    spread.add_argument("--out", help="also write the table to this file")
    profile = commands.add_parser(
        "profile",
        help="print a profile (an overlay on params.yaml, e.g. profiles/paper.yaml) as `dvc exp run` "
        "-S overrides: selfcest profile profiles/paper.yaml --set model.init_from=DIR --print0 | "
        "xargs -0 dvc exp run",
    )
    profile.add_argument("profile", help="a YAML overlay whose keys all exist in params.yaml")
    profile.add_argument(
        "--params", default="params.yaml", help="the params file the keys are checked against"
    )
    profile.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override (wins), e.g. a path",
    )
    profile.add_argument(
        "--print0",
        action="store_true",
        help="NUL-separated arguments for `xargs -0 dvc exp run` (the default output is shell-quoted)",
    )
    args = parser.parse_args(argv)
    commands_run = {"profile": cmd_profile, "solve": cmd_solve, "compare": cmd_compare, "spread": cmd_spread}
    if args.command not in commands_run:
        return 2
    try:
        return commands_run[args.command](args)
    except BrokenPipeError:
        # The reader went away (`selfcest profile ... | head`): a traceback there is noise. Python's
        # own advice: point stdout at devnull, so that the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
