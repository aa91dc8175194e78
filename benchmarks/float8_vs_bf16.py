"""float8 (torchao) vs bf16 training step time on large Linear stacks, for a CUDA GPU with capability >= 8.9.

Usage::

    python benchmarks/float8_vs_bf16.py                 # H100/H200: sizes 2048 4096 8192, torch.compile on
    python benchmarks/float8_vs_bf16.py --sizes 4096 --recipe rowwise
    python benchmarks/float8_vs_bf16.py --dry-run       # CPU: tiny float32 shapes, no float8: checks the plumbing

Each size builds ``Linear(d, 4d) -> GELU -> Linear(4d, d)`` (an MLP block), runs forward + backward + AdamW step for
bf16 and float8 interleaved (A B A B), and prints median step times and the ratio (> 1: float8 faster). torchao reports
float8 wins from about 4096 wide on H100; smaller shapes are often slower (cast overhead). Target: >= 1.2x at 4096+.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_speedups.measure import interleaved_timings, median, model_copy


def _block(d: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False)]
    return nn.Sequential(*mods)


def _step_fn(model: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step() -> None:
        with autocast:
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run(
    sizes: list[int], tokens: int, layers: int, recipe: str, compile_: bool, repeats: int, dry_run: bool
) -> list[dict[str, Any]]:
    """Benchmark each size; in ``dry_run`` mode use CPU/float32 and skip the float8 conversion (plumbing check)."""
    cuda = torch.cuda.is_available() and not dry_run
    if not dry_run:
        if not cuda or torch.cuda.get_device_capability() < (8, 9):
            raise SystemExit("float8 needs a CUDA GPU with compute capability >= 8.9 (use --dry-run on CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    for d in sizes:
        torch.manual_seed(0)
        base = _block(d, layers).to(device)
        f8 = model_copy(base)
        converted = 0
        if not dry_run:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            convert_to_float8_training(f8, config=Float8LinearConfig.from_recipe_name(recipe))
            converted = sum(type(m).__name__ == "Float8Linear" for m in f8.modules())
        if compile_ and not dry_run:
            base = torch.compile(base)
            f8 = torch.compile(f8)
        x = torch.randn(tokens, d, device=device, dtype=dtype)
        steps = {"bf16": _step_fn(base, x, dtype), "float8": _step_fn(f8, x, dtype)}
        times = interleaved_timings(steps, repeats, warmup=2 if dry_run else 5, sync=cuda)
        b = median(times["bf16"])
        f = median(times["float8"])
        rows.append(
            {"size": d, "tokens": tokens, "bf16_s": b, "float8_s": f, "ratio": b / f, "float8_layers": converted}
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="model widths d (Linear d -> 4d -> d)")
    p.add_argument("--tokens", type=int, default=None, help="rows per batch (batch * sequence length)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--recipe", default="tensorwise", choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"])
    p.add_argument("--no-compile", action="store_true", help="eager float8 (slower: casts are not fused)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, no float8: checks the script runs")
    p.add_argument("--json", action="store_true", help="print rows as JSON")
    a = p.parse_args(argv)
    sizes = a.sizes or ([32, 64] if a.dry_run else [2048, 4096, 8192])
    tokens = a.tokens or (16 if a.dry_run else 16384)
    repeats = a.repeats or (2 if a.dry_run else 20)
    rows = run(sizes, tokens, a.layers, a.recipe, not a.no_compile, repeats, a.dry_run)
    device = "cpu (dry run: float32 vs float32, no float8)" if a.dry_run else torch.cuda.get_device_name(0)
    print(f"# float8 ({a.recipe}) vs bf16 training step | {device} | torch {torch.__version__}")
    if a.json:
        print(json.dumps(rows))
    else:
        print(f"{'size':>6} {'tokens':>7} {'bf16 ms':>9} {'float8 ms':>10} {'ratio':>7}")
        for r in rows:
            verdict = "" if r["ratio"] > 1.0 else "  no speedup"
            print(
                f"{r['size']:>6} {r['tokens']:>7} {r['bf16_s'] * 1e3:9.3f} {r['float8_s'] * 1e3:10.3f} "
                f"{r['ratio']:6.2f}x{verdict}"
            )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
