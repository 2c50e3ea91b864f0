"""Capture time side by side: shardwise.capture through torch.export vs TorchScript
(trace + C++ importer), on transformers GPT-2 shapes built on the meta device (no
weights) except where TorchScript needs real tensors. Prints each time and the ratio
export / torchscript. Timing never fails anything: this is a measurement.

    python benchmarks/capture.py [--layers 12 24 48] [--record]
"""
from __future__ import annotations

import argparse
import platform
import time
import warnings

import torch

import shardwise
from _results import add_record_argument, record


def gpt2(layers: int, hidden: int, heads: int, device: str):
    import transformers

    cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, use_cache=False)
    with torch.device(device):
        model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 128), device=device)
    return model, {"input_ids": ids, "labels": ids}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 24, 48])
    parser.add_argument("--hidden", type=int, default=768)
    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print(f"{'model':<26}{'nodes':>7}{'export s':>10}{'torchscript s':>15}{'export/ts':>11}{'meta export s':>15}")
    for layers in args.layers:
        heads = args.hidden // 64
        model, inputs = gpt2(layers, args.hidden, heads, "cpu")
        g_export, t_export = timed(lambda: shardwise.capture(model, inputs, method="export"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice, once per call
            _, t_ts = timed(lambda: shardwise.capture(model, inputs, method="torchscript"))
        meta_model, meta_inputs = gpt2(layers, args.hidden, heads, "meta")
        _, t_meta = timed(lambda: shardwise.capture(meta_model, meta_inputs, method="export"))
        name = f"GPT-2 l={layers} h={args.hidden}"
        print(f"{name:<26}{g_export.num_nodes():>7}{t_export:>10.2f}{t_ts:>15.2f}{t_export / t_ts:>11.2f}{t_meta:>15.2f}")
        rows.append([name, g_export.num_nodes(), t_export, t_ts, t_export / t_ts, t_meta])
    model, inputs = gpt2(48, 1600, 25, "meta")
    g, t = timed(lambda: shardwise.capture(model, inputs))
    print(f"GPT-2 XL shape (48 x 1600) on meta: {t:.2f} s, {g.num_nodes()} nodes, "
          f"{g.num_parameters() / 1e9:.2f}B parameters, repeated {max(len(b) for b in g.repeated_blocks())} blocks")
    if args.record:
        rows.append(["GPT-2 XL shape (48 x 1600), meta", g.num_nodes(), None, None, None, t])
        record("capture", rows, {
            "columns": ["model", "nodes", "export s", "torchscript s", "export/ts", "meta export s"],
            "formats": {"export s": ".2f", "torchscript s": ".2f", "export/ts": ".2f", "meta export s": ".2f"},
            "notes": f"GPT-2 XL shape: {g.num_parameters() / 1e9:.2f}B parameters, "
                     f"{max(len(b) for b in g.repeated_blocks())} repeated blocks, captured on meta only."})


if __name__ == "__main__":
    main()
