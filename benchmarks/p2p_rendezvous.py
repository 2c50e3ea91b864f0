"""Does a point-to-point transfer start at the send, or only once its receive is posted?

The pipeline simulator (csrc/schedule/simulator.h) starts a transfer at max(send, receive
posted), because the runtime posts each receive just before the compute that reads it and
the transports pair a send with its receive before moving the bytes. This measures that on
the backend given (Gloo by default; `--backend nccl` on a machine with 2 GPUs):

- `late`: rank 0 posts its isend, then waits `--delay` seconds; rank 1 posts its irecv only
  after the same delay. The receive's wait is the transfer if nothing moved meanwhile, and
  about 0 if the bytes had already arrived. The send's wait() after the delay says the same.
- `together`: a blocking send and receive posted at once: the transfer time itself.

    python benchmarks/p2p_rendezvous.py [--mb 1 16 134] [--delay 1.0] [--record]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, store: str, backend: str, sizes: list[float], delay: float, result: str) -> None:
    dist.init_process_group(backend, store=dist.FileStore(store, 2), rank=rank, world_size=2)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rows = []
    try:
        for mb in sizes:
            t = torch.ones(int(mb * 1e6 / 4), device=device)
            dist.barrier()
            if rank == 0:
                work = dist.isend(t, 1)
                time.sleep(delay)
                start = time.perf_counter()
                work.wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                send_wait = time.perf_counter() - start
            else:
                time.sleep(delay)
                start = time.perf_counter()
                dist.irecv(t, 0).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                recv_wait = time.perf_counter() - start
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            together = time.perf_counter() - start
            dist.barrier()
            box = [send_wait if rank == 0 else recv_wait, together]
            gathered = [None, None]
            dist.all_gather_object(gathered, box)
            rows.append((mb, gathered[0][0], gathered[1][0], gathered[1][1]))
        if rank == 0:
            with open(result, "w") as f:
                for row in rows:
                    f.write(" ".join(str(x) for x in row) + "\n")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--mb", type=float, nargs="+", default=[1.0, 16.0, 134.0])
    parser.add_argument("--delay", type=float, default=1.0)
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result")
        mp.spawn(_worker, args=(os.path.join(tmp, "store"), args.backend, args.mb, args.delay, result), nprocs=2)
        with open(result) as f:
            rows = [[float(x) for x in line.split()] for line in f]
    print(f"backend {args.backend}, torch {torch.__version__}; receive posted {args.delay} s after the send")
    print(f"{'MB':>8} {'send wait s':>12} {'recv wait s':>12} {'together s':>11} {'recv / together':>16}")
    for mb, send_wait, recv_wait, together in rows:
        print(f"{mb:>8.1f} {send_wait:>12.4f} {recv_wait:>12.4f} {together:>11.4f} {recv_wait / together:>16.2f}")
    print("(recv / together near 1: the transfer started when the receive was posted; near 0: at the send)")
    if args.record:
        from _machine import cpu_model

        record("p2p_rendezvous", [[mb, s, r, t, r / t] for mb, s, r, t in rows], {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.backend}",
            "columns": ["MB", "send wait s", "recv wait s", "together s", "recv / together"],
            "formats": {"MB": ".1f", "send wait s": ".4f", "recv wait s": ".4f", "together s": ".4f",
                        "recv / together": ".2f"},
            "notes": f"Receive posted {args.delay} s after the send. recv / together near 1: the transfer started "
                     "when the receive was posted (rendezvous); near 0: at the send."})


if __name__ == "__main__":
    main()
