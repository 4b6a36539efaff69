"""bench/torch_kernels.py: the C engine's kernels and training step beside PyTorch's, on one core.

    .venv/bin/python bench/torch_kernels.py [--quick] [--repeats N] [--max-tokens N] [--sections S]
                                            [--bench build/bench_kernels]

Every row of bench_kernels (docs/kernels.md) on both sides, the same shapes and the same tokens:

    mm     the model's matmuls at T = 4096 (configs "small" and "base"): forward x W^T, backward dX,
           backward dW. Engine: matmul_forward / matmul_backward (OpenBLAS sgemm). PyTorch: torch.mm
           into a preallocated output (forward, dX: beta 0 on both sides), addmm_ into the gradient
           (dW: the engine's accumulates).
    attn   attention forward and backward, one causal segment of 1K..32K tokens (base: to 16K), and
           bench_kernels' 8K pack of short segments (the same lengths: bench_kernels --row seglens).
           Engine: attn_forward; attn_backward_delta + attn_backward. PyTorch: its best CPU path for
           the job, F.scaled_dot_product_attention (the CPU flash kernel) with is_causal on the
           segment, and for the pack one causal call per segment (q, k, v split along the tokens,
           the outputs concatenated): a block-diagonal attn_mask runs the whole 8K x 8K square and
           was 14x slower here. K/V heads repeated to the query heads (repeat_interleave, its
           backward included) or enable_gqa=True: --gqa picks; repeat is the default, the faster here.
           Backward: o.backward(dout, retain_graph=True) after one forward.
    step   one training micro-batch of T tokens (4096; --quick 1024), one causal segment: forward,
           loss, backward, no optimizer. Engine: llama_forward_backward. PyTorch: bytescale.torch's
           Llama (the same architecture and parameter count, python/bytescale/torch/model.py) with
           its attention call replaced by the SDPA above; loss_sum / T, backward.

Both sides run on this thread, fp32, one thread (torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1),
timed by thread CPU time: on a shared core that leaves out the time others hold it. Each call takes
the best of a row's repeats (bench_kernels' rule: repeats until 0.3 s / 0.5 s have passed, at most
50 / 10); the engine's side runs in `bench_kernels --row SPEC`, the two sides alternate, engine
first on even rounds and PyTorch first on odd ones, and the table shows each side's median over
--repeats rounds. % peak divides by the best of the FMA-loop samples (bench_kernels --row peak) taken
at the start, between sections and at the end. FLOPs follow bench_kernels' conventions (visible
pairs counted exactly, backward 2.5x the forward, the step 3x the model's forward).

Prints a markdown table on stdout; progress on stderr.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("BYTESCALE_LIB", os.path.join(ROOT, "build", "libbytescale.so.0"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bytescale.torch.model import Llama, LlamaConfig  # noqa: E402

WEIGHTS = ["wq", "wk", "wo", "w_gate", "w_down", "lm_head"]  # wk stands for wk / wv, w_gate for w_gate / w_up
T_MM = 4096


def progress(msg):
    print(msg, file=sys.stderr, flush=True)


def time_best(fn, min_total, max_reps):
    """bench_kernels' time_best: one run, then more until min_total seconds; the best, thread CPU time."""
    best, total, rep = float("inf"), 0.0, 0
    while rep < max_reps and (rep == 0 or total < min_total):
        t0 = time.thread_time()
        fn()
        t = time.thread_time() - t0
        total += t
        best = min(best, t)
        rep += 1
    return best


class Engine:
    """The engine's side: build/bench_kernels --row SPEC, one process a call."""

    def __init__(self, path):
        self.path = path
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def call(self, spec):
        out = subprocess.run([self.path, "--row", spec], env=self.env, check=True, capture_output=True, text=True)
        return out.stdout.split()

    def peak(self):
        return float(self.call("peak")[1])

    def seglens(self):
        words = self.call("seglens")
        return [int(w) for w in words[2:2 + int(words[1])]]

    def row(self, spec):
        words = self.call(spec)
        return float(words[2]), float(words[3])


# ---- PyTorch's side ---------------------------------------------------------------------------------

def model_dims(cfg, weight):
    """(C, OC) of a weight (OC, C), as bench_kernels' matmul_shapes."""
    q, kv, d, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_model, cfg.d_ff
    return {"wq": (d, q), "wk": (d, kv), "wo": (q, d), "w_gate": (d, f), "w_down": (f, d),
            "lm_head": (d, cfg.vocab_size)}[weight]


def torch_matmul(cfg, weight, direction):
    C, OC = model_dims(cfg, weight)
    T = T_MM
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.rand(*s, generator=g) * 2 - 1
    x, dx, out, dout, w, dw = r(T, C), r(T, C), r(T, OC), r(T, OC), r(OC, C), r(OC, C)
    fns = {"fwd": lambda: torch.mm(x, w.t(), out=out),
           "dx": lambda: torch.mm(dout, w, out=dx),
           "dw": lambda: dw.addmm_(dout.t(), x)}
    return time_best(fns[direction], 0.3, 50), 2.0 * T * C * OC / 1e9


def sdpa(q, k, v, gqa):
    """Causal attention of q (1, H, S, hd), k, v (1, G, S, hd), PyTorch's fused CPU kernel."""
    r = q.shape[1] // k.shape[1]
    if gqa or r == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=r > 1)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=True)


def attention_fn(lens, gqa):
    """attention over the segments of lens (one: a causal segment), each segment alone."""
    if len(lens) == 1:
        return lambda q, k, v: sdpa(q, k, v, gqa)

    def pack(q, k, v):
        outs = [sdpa(a, b, c, gqa) for a, b, c in zip(q.split(lens, 2), k.split(lens, 2), v.split(lens, 2))]
        return torch.cat(outs, 2)
    return pack


def visible_pairs(lens):
    return sum(n * (n + 1) // 2 for n in lens)


def torch_attention(cfg, lens, direction, gqa):
    T, H, G, hd = sum(lens), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = torch.Generator().manual_seed(T)
    r = lambda *s: (torch.rand(*s, generator=g) * 2 - 1).requires_grad_(True)
    q, k, v = r(1, H, T, hd), r(1, G, T, hd), r(1, G, T, hd)
    dout = torch.rand(1, H, T, hd, generator=g) * 2 - 1
    fn = attention_fn(lens, gqa)
    flops = (4.0 if direction == "fwd" else 10.0) * hd * H * visible_pairs(lens)
    if direction == "fwd":
        with torch.no_grad():
            t = time_best(lambda: fn(q, k, v), 0.5, 10)
    else:
        o = fn(q, k, v)
        t = time_best(lambda: o.backward(dout, retain_graph=True), 0.5, 10)
    return t, flops / 1e9


class SDPAAttention(torch.nn.Module):
    """The model's attention call, (T, H, hd) -> (T, H, hd), as the SDPA above on one causal segment."""

    def __init__(self, gqa):
        super().__init__()
        self.gqa = gqa

    def forward(self, q, k, v):
        return sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                    self.gqa)[0].transpose(0, 1)


def step_flops(cfg, T):
    """bench_kernels' model FLOPs: 3 x (2 x matmul parameters per token + 4 hd H per visible pair and layer)."""
    q, kv, d = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_model
    mm = cfg.n_layers * (d * q * 2 + d * kv * 2 + 3 * d * cfg.d_ff) + d * cfg.vocab_size
    attn = cfg.n_layers * 4.0 * cfg.head_dim * cfg.n_heads * visible_pairs([T])
    return 3.0 * (2.0 * mm * T + attn)


def torch_step(cfg, T, gqa, cache={}):
    key = (cfg.name, T, gqa)
    if key not in cache:  # one model a row (weights drawn once, as the engine's llama_init_weights)
        m = Llama(cfg, attention=SDPAAttention(gqa)).init_weights(1)
        g = torch.Generator().manual_seed(4)
        tok = torch.randint(0, cfg.vocab_size, (T,), generator=g)
        tgt = torch.cat([tok[1:], torch.tensor([-1])])
        cache[key] = (m, tok, tgt, torch.arange(T))
    m, tok, tgt, pos = cache[key]

    def run(n):
        m.zero_grad(set_to_none=False)
        (m.loss_sum(tok[:n], tgt[:n], pos[:n]) / n).backward()
    run(min(T, 256))  # the engine's warm-up
    return time_best(lambda: run(T), 0.0, 2), step_flops(cfg, T) / 1e9


# ---- the table ----------------------------------------------------------------------------------------

def rows(args):
    """(section, label, engine spec, torch thunk)."""
    out = []
    models = [LlamaConfig.named("small"), LlamaConfig.named("base")]
    if "mm" in args.sections:
        for cfg in models:
            for w in WEIGHTS:
                for d in ("fwd", "dx", "dw"):
                    out.append(("mm", f"{cfg.name} {w} {d}", f"mm:{cfg.name}:{w}:{d}",
                                lambda cfg=cfg, w=w, d=d: torch_matmul(cfg, w, d)))
    if "attn" in args.sections:
        for cfg in models:
            top = args.max_tokens or (4096 if args.quick else 32768 if cfg.name == "small" else 16384)
            cases = [(str(T), f"{T // 1024}K causal", [T]) for T in (1024 << i for i in range(6)) if T <= top]
            cases.append(("pack", f"8K pack of {len(args.seglens)}", args.seglens))
            for tok, label, lens in cases:
                for d in ("fwd", "bwd"):
                    out.append(("attn", f"{cfg.name} {label} {d}", f"attn:{cfg.name}:{tok}:{d}",
                                lambda cfg=cfg, lens=lens, d=d: torch_attention(cfg, lens, d, args.gqa)))
    if "step" in args.sections:
        T = 1024 if args.quick else 4096
        for cfg in models:
            out.append(("step", f"{cfg.name} step {T} tokens", f"step:{cfg.name}:{T}",
                        lambda cfg=cfg: torch_step(cfg, T, args.gqa)))
    return [r for r in out if not args.only or any(w in r[1] for w in args.only)]


def measure(args, engine):
    todo = rows(args)
    peaks, results, section = [engine.peak()], [], None
    progress(f"torch_kernels: {len(todo)} rows x {args.repeats} rounds; FMA peak {peaks[0]:.1f} GFLOP/s")
    for i, (sec, label, spec, thunk) in enumerate(todo):
        if sec != section and section is not None:
            peaks.append(engine.peak())
        section = sec
        te, tt = [], []
        for rnd in range(args.repeats):
            sides = [("e", lambda: engine.row(spec)), ("t", thunk)]
            for side, fn in (sides if rnd % 2 == 0 else sides[::-1]):
                t, gflop = fn()
                (te if side == "e" else tt).append(t)
        e, t = statistics.median(te), statistics.median(tt)
        results.append((label, gflop, e, t))
        progress(f"[{i + 1}/{len(todo)}] {label}: engine {e:.4f} s, torch {t:.4f} s, engine {t / e:.2f}x")
    peaks.append(engine.peak())
    return results, max(peaks)


def print_table(results, peak, args):
    print(f"PyTorch {torch.__version__}, one thread; FMA peak {peak:.1f} GFLOP/s "
          f"(best of the samples); medians of {args.repeats} alternating rounds, thread CPU time; "
          f"attention K/V heads {'enable_gqa' if args.gqa else 'repeat_interleave'}")
    print()
    print("| row | GFLOP | engine s | engine % peak | torch s | torch % peak | engine speed / torch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, gflop, e, t in results:
        print(f"| {label} | {gflop:.3f} | {e:.4f} | {100 * gflop / e / peak:.1f}% | {t:.4f} | "
              f"{100 * gflop / t / peak:.1f}% | {t / e:.2f}x |")
    worst = min(results, key=lambda r: r[3] / r[2])
    behind = [r[0] for r in results if r[3] < r[2]]
    print()
    print(f"Weakest row: {worst[0]}, engine {worst[3] / worst[2]:.2f}x PyTorch's speed. "
          f"Engine behind in {len(behind)} of {len(results)} rows{': ' + ', '.join(behind) if behind else ''}.")


def warm_up(gqa):
    """One small attention forward and backward, and a matmul: PyTorch's first backward pays a
    one-time setup (0.7 s here) that would land in the first row."""
    q, k, v = (torch.rand(1, h, 256, 64, requires_grad=True) for h in (4, 2, 2))
    sdpa(q, k, v, gqa).sum().backward()
    torch.mm(torch.rand(256, 256), torch.rand(256, 256))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="attention to 4K tokens, the step at 1K, one round")
    ap.add_argument("--repeats", type=int, default=None, help="alternating rounds a row (default 3; --quick 1)")
    ap.add_argument("--max-tokens", type=int, default=0, help="longest attention segment")
    ap.add_argument("--sections", default="mm,attn,step", help="comma list of mm, attn, step")
    ap.add_argument("--only", action="append", help="rows whose label contains this (repeatable)")
    ap.add_argument("--gqa", action="store_true", help="SDPA's enable_gqa instead of repeated K/V heads")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench_kernels"))
    args = ap.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.sections = args.sections.split(",")
    torch.set_num_threads(1)
    warm_up(args.gqa)
    engine = Engine(args.bench)
    args.seglens = engine.seglens()
    wall0, cpu0 = time.time(), time.process_time()
    results, peak = measure(args, engine)
    print_table(results, peak, args)
    progress(f"torch_kernels: wall {time.time() - wall0:.0f} s, this process's CPU {time.process_time() - cpu0:.0f} s")


if __name__ == "__main__":
    main()
