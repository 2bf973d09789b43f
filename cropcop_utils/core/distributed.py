"""One process or several: the process group ``torchrun`` describes, and the two collectives training uses.

gloo on CPU, NCCL on GPU.  Without ``WORLD_SIZE`` in the environment everything here is a no-op, so the
training loop has a single code path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the group (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistEnv:
    """Join the process group ``torchrun`` describes in the environment; a no-op for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    import torch.distributed as dist

    env = DistEnv(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return env


def gather(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``obj`` in rank order (``[obj]`` for one process)."""
    if not env.enabled:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.enabled:
        import torch.distributed as dist

        dist.barrier()


def broadcast_buffers(module: Any, env: DistEnv) -> None:
    """Give every rank rank 0's buffers (batch-norm statistics).

    DDP broadcasts them only at the start of a training forward; the forward itself then updates each
    rank's copy from its own batch.  A sharded evaluation after the last step would otherwise score part
    of the rows with statistics that are not the ones rank 0 saves.
    """
    if not env.enabled:
        return
    import torch.distributed as dist

    for buffer in module.buffers():
        dist.broadcast(buffer.data, src=0)
