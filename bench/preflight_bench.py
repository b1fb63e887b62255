"""Pre-flight on a GPU machine (issue 27 item 2): the GPU check through CUDA (`TorchGpus`, which
the CPU-only test machines cannot run) and the all-reduce bus bandwidth the pre-flight records,
over every GPU of the node with NCCL. One GPU: only the check (an all-reduce needs two ranks).

    python3 -m torch.distributed.run --standalone --nproc-per-node=N bench/preflight_bench.py
    (bash bench/device_run.sh preflight does this with N = the GPUs nvidia-smi lists)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result

from clusterfsdp.worker import preflight


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    check = preflight.check_gpus(torch.cuda.device_count(), preflight.TorchGpus()) if local == 0 else None
    speeds: list[float | None] = [None] * world
    dist.all_gather_object(speeds, preflight.all_reduce_busbw(device, world))
    if dist.get_rank() == 0 and check is not None:
        measured = [s for s in speeds if s is not None]
        result("preflight", gpus_ok=check.ok, gpus=check.detail, world=world,
               allreduce_mib=preflight.ALLREDUCE_BYTES >> 20, busbw_gbps_min=min(measured) if measured else None,
               busbw_gbps_max=max(measured) if measured else None)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
