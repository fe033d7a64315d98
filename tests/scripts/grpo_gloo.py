"""Two-process GRPO on gloo (run with torch.distributed.run): each rank gets different clone counts."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist  # noqa: E402
from grpo_helpers import make_trainer  # noqa: E402

checkpoint, output = Path(sys.argv[1]), Path(sys.argv[2])
trainer = make_trainer(checkpoint, output, seed=0)
trainer.train()
rank = trainer.accelerator.process_index
rows = trainer.state.log_history[0].get("selfcest/clone_rows")
print(
    f"rank={rank} world={trainer.accelerator.num_processes} steps={trainer.state.global_step} clone_rows={rows}"
)
if dist.is_initialized():
    dist.barrier()
