"""Command line: python -m shardwise <command> (also installed as `shardwise`).

  inspect MODEL    capture MODEL and print its summary (parameters, FLOPs, repeated
                   blocks, unknown ops). MODEL: tiny-gpt | module:function | hf:NAME
  train            train the built-in TinyGPT under torchrun, next to a single-device run:
                   torchrun --nproc-per-node 4 -m shardwise train
  plan MODEL       search a plan: --cluster PRESET|JSON [--nodes N] --global-batch B
                   [--level fast|thorough] [--out plan.json]; MODEL also gpt:L,H,HEADS
  simulate PLAN    the plan's pipeline timeline: --svg timeline.svg [--trace trace.json]
  run SCRIPT       the torchrun line that trains SCRIPT (--plan plan.json, --exec)
"""
from __future__ import annotations

import argparse
import logging
import sys
import time


def _inspect(args: argparse.Namespace) -> int:
    import shardwise
    from shardwise.models.registry import resolve_model

    model, inputs = resolve_model(args.model, batch=args.batch, seq=args.seq)
    t0 = time.perf_counter()
    graph = shardwise.capture(model, inputs, method=args.method)
    elapsed = time.perf_counter() - t0
    print(f"captured {args.model} with {args.method} in {elapsed:.2f} s: "
          f"{graph.num_nodes()} nodes, {graph.num_parameters():,} parameters")
    print(graph.summary())
    if args.print_ir:
        print(graph)
    if args.json:
        with open(args.json, "w") as f:
            f.write(graph.to_json(indent=1))
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardwise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="capture a model and print its summary")
    p.add_argument("model", nargs="?", default="tiny-gpt")
    p.add_argument("--method", choices=("export", "fx", "torchscript"), default="export")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=None, help="sequence length for hf: models (default 128)")
    p.add_argument("--json", help="also write the graph as JSON to this file")
    p.add_argument("--print-ir", action="store_true", help="print the IR text")
    p.set_defaults(run=_inspect)
    from shardwise._cli_plan import add_parsers as add_planning
    from shardwise.train_demo import add_parser as add_train

    add_train(sub)
    add_planning(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except KeyboardInterrupt:  # Ctrl-C: files are written whole at the end, so none is half-written
        print("shardwise: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a CLI prints the error, not a traceback
        import shardwise

        if isinstance(e, (shardwise.ShardwiseError, ValueError)) and not args.verbose:
            print(f"shardwise: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
