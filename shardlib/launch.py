"""Run a rank function under ``torchrun``: the same code a notebook runs on ``Ranks``.

    torchrun --standalone --nproc-per-node 2 -m shardlib.launch shardlib.runtime.basics:first_all_reduce_on_rank

``module:function`` names any importable rank function ``fn(ctx, *args)``; extra command-line words are
passed as arguments (numbers are converted). Each rank prints its result as ``[rank R] result``, then
its comm log. On a machine with one GPU per rank the ranks use NCCL; otherwise gloo on CPU.
"""

from __future__ import annotations

import argparse
import ast
import importlib

import torch.distributed as dist

from .runtime.records import format_log
from .runtime.context import RankContext


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shardlib.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="module:function, e.g. shardlib.runtime.basics:first_all_reduce_on_rank")
    parser.add_argument("args", nargs="*", help="arguments passed to the function after ctx")
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    opts = parser.parse_args(argv)
    module_name, _, fn_name = opts.target.partition(":")
    if not fn_name:
        parser.error(f"target must look like module:function, got {opts.target!r}")
    fn = getattr(importlib.import_module(module_name), fn_name)
    ctx = RankContext.from_env(opts.backend)
    result = fn(ctx, *[_value(a) for a in opts.args])
    print(f"[rank {ctx.rank}] {result}", flush=True)
    print("\n".join(f"[rank {ctx.rank}] {line}" for line in format_log(ctx.comm.records).splitlines()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
