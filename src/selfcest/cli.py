"""`selfcest` command line: try any local checkpoint on a question in one line.

selfcest solve --model artifacts/selfcest_model "Calculate the value of 12+7-3."
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from selfcest.engine import SamplingConfig, TransformersEngine
from selfcest.model import load_model
from selfcest.prompts import qa_root_question
from selfcest.runtime import AgentRecord, Episode, Runtime, RuntimeConfig, Task
from selfcest.tokenizer import load_tokenizer


def _tree_lines(episode: Episode) -> list[str]:
    lines: list[str] = []

    def visit(agent: AgentRecord, indent: int) -> None:
        pad = "  " * indent
        task = agent.task.replace("\n", " ")
        lines.append(
            f"{pad}{agent.agent_id} [{agent.status}] gen={agent.generated_tokens} prompt={agent.prompt_tokens} "
            f"max_tokens={agent.max_tokens} answer={agent.answer!r}"
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


def cmd_solve(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, device=args.device)
    config = RuntimeConfig(
        use_tools=not args.no_tools,
        episode_token_budget=args.budget,
        root_max_tokens=args.root_max_tokens,
        clone_max_tokens=args.clone_max_tokens,
        max_depth=args.max_depth,
    )
    documents: dict[str, str] = {}
    if args.documents:
        documents = json.loads(Path(args.documents).read_text(encoding="utf-8"))
        if not isinstance(documents, dict):
            print(
                f"error: {args.documents} must hold a JSON object mapping keys to paragraph text",
                file=sys.stderr,
            )
            return 2
    question = args.question
    if documents and config.use_tools:
        question = qa_root_question(question, list(documents))
    runtime = Runtime(TransformersEngine(model, tokenizer), config)
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed)
    [episode] = runtime.run([Task("cli", question, documents=documents)], sampling=sampling)
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
    for line in _tree_lines(episode):
        print("  " + line)
    if args.verbose:
        for agent in episode.agents:
            print(f"--- {agent.agent_id}")
            print(tokenizer.decode(agent.token_ids))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="selfcest", description="SELFCEST: learned delegation by clones")
    commands = parser.add_subparsers(dest="command", required=True)
    solve = commands.add_parser("solve", help="run one episode on a local checkpoint and print the tree")
    solve.add_argument("question")
    solve.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    solve.add_argument("--documents", help="JSON file {key: paragraph} handed to clones by key")
    solve.add_argument("--budget", type=int, default=1024, help="tree-wide generated-token budget")
    solve.add_argument("--root-max-tokens", type=int, default=160)
    solve.add_argument("--clone-max-tokens", type=int, default=96)
    solve.add_argument("--max-depth", type=int, default=1)
    solve.add_argument("--no-tools", action="store_true", help="monolithic: no spawn_clone tool")
    solve.add_argument("--temperature", type=float, default=0.0)
    solve.add_argument("--seed", type=int, default=0)
    solve.add_argument("--device", default="cpu")
    solve.add_argument("--json", action="store_true", help="print the whole episode record as JSON")
    solve.add_argument("--verbose", action="store_true", help="print every agent's full context")
    args = parser.parse_args(argv)
    if args.command == "solve":
        return cmd_solve(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
