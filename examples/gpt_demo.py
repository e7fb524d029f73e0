"""Train a small GPT twice on the same data, plain PyTorch vs apex, and compare them.

    python examples/gpt_demo.py [--steps N] [--device cpu|cuda] [--opt-level O5]

plain: fp32, torch.optim.AdamW, torch.nn.LayerNorm.
apex:  amp (O2 fp16 with loss scaling on a GPU; on a CPU O5 bf16 where it has bf16 matrix
       instructions, else O0 fp32; one flat grad buffer), FusedAdam, FusedLayerNorm (or
       FusedRMSNorm with --norm rms).

The task is synthetic and embedded (no download): character-level addition problems such as
"417+38=455;". Each run starts in a fresh process so peak memory is its own.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# Runnable from a source checkout too: apex and its compiled-module faces (amp_C, ...) come from there.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[1:1] = [_REPO, os.path.join(_REPO, "compatibility")]
from gpt_model import GPT  # noqa: E402

VOCAB = "0123456789+=;"
# Sized to finish in about a minute per run on a small CPU, and to give a GPU real work.
SIZES = {"cpu": dict(dim=64, layers=2, context=32, batch=16),
         "cuda": dict(dim=384, layers=6, context=256, batch=64)}
LOSS_WINDOW = 10  # the final loss is a mean over the last steps: single-batch losses are noisy
WARMUP_STEPS = 5  # excluded from steps/s (first-call allocation, kernel loading)


def addition_corpus(problems=20000, seed=0):
    """One long token stream of "a+b=c;" problems, a and b below 1000."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, 1000, (2, problems), generator=gen)
    text = "".join(f"{x}+{y}={x + y};" for x, y in zip(a.tolist(), b.tolist()))
    return torch.tensor([VOCAB.index(c) for c in text])


def batches(corpus, steps, device, context, batch, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(corpus) - context - 1, (batch,), generator=gen)
        window = torch.stack([corpus[s:s + context + 1] for s in starts.tolist()]).to(device)
        yield window[:, :-1], window[:, 1:]


class ProgressBar:
    """Plain-text progress: redrawn in place on a terminal (every 1%), a line every 10% otherwise."""

    def __init__(self, label, total, width=30):
        self.label, self.total, self.width = label, total, width
        self.interactive = sys.stderr.isatty()
        self.start = time.perf_counter()

    def update(self, done, loss):
        """`loss` is a tensor: read (a device sync) only when a line is drawn."""
        redraws = 100 if self.interactive else 10  # few redraws: each one waits for the device
        if done % max(1, self.total // redraws) and done != self.total:
            return
        loss = loss.item()
        filled = self.width * done // self.total
        rate = done / (time.perf_counter() - self.start)
        line = (f"{self.label:>6} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{done}/{self.total}  loss {loss:.3f}  {rate:.1f} steps/s")
        print(("\r" + line) if self.interactive else line, end="" if self.interactive else "\n",
              file=sys.stderr, flush=True)
        if self.interactive and done == self.total:
            print(file=sys.stderr)


def resident_memory_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(flavor, args):
    """The model, optimizer and loss-scaling context of one flavor."""
    torch.manual_seed(0)
    size = dict(dim=args.size["dim"], layers=args.size["layers"])
    if flavor == "plain":
        model = GPT(len(VOCAB), args.size["context"], **size).to(args.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        return model, optimizer, lambda loss, opt: contextlib.nullcontext(loss)

    from apex import amp
    from apex.normalization import FusedLayerNorm, FusedRMSNorm
    from apex.optimizers import FusedAdam

    norm = FusedRMSNorm if args.norm == "rms" else FusedLayerNorm
    model = GPT(len(VOCAB), args.size["context"], norm=norm, **size).to(args.device)
    optimizer = FusedAdam(model.parameters(), lr=args.lr)  # AdamW mode, like the plain run
    model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level, combine_grad=True, verbosity=0)
    return model, optimizer, lambda loss, opt: amp.scale_loss(loss, opt)


def run(flavor, args):
    """Train one flavor; returns its measurements."""
    cuda = args.device.startswith("cuda")
    memory_before = 0 if cuda else resident_memory_bytes()
    peak = memory_before
    model, optimizer, scaled = build(flavor, args)
    corpus = addition_corpus()
    bar = ProgressBar(flavor, args.steps)
    losses = []
    for step, (tokens, targets) in enumerate(batches(corpus, args.steps, args.device, args.size["context"], args.size["batch"]), start=1):
        if step == WARMUP_STEPS + 1:
            if cuda:
                torch.cuda.synchronize()
            timed_from = time.perf_counter()
        logits = model(tokens)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad()
        with scaled(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        losses.append(loss.detach())  # no .item() per step: a host sync would stall the GPU queue
        if not cuda:
            peak = max(peak, resident_memory_bytes())
        bar.update(step, losses[-1])
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - timed_from
    peak_bytes = torch.cuda.max_memory_allocated() if cuda else peak - memory_before
    return {"steps_per_s": (args.steps - WARMUP_STEPS) / seconds, "peak_mib": peak_bytes / 2**20,
            "final_loss": torch.stack(losses[-LOSS_WINDOW:]).mean().item()}


def run_in_fresh_process(flavor, args):
    command = [sys.executable, os.path.abspath(__file__), "--worker", flavor, "--steps", str(args.steps),
               "--device", args.device, "--opt-level", args.opt_level, "--norm", args.norm, "--lr", str(args.lr)]
    out = subprocess.run(command, stdout=subprocess.PIPE, check=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def print_table(results, args):
    plain, fused = results["plain"], results["apex"]
    memory = "peak GPU memory (MiB)" if args.device.startswith("cuda") else "peak RSS growth (MiB)"
    rows = [("steps/s", "{:.2f}", "steps_per_s"), (memory, "{:.1f}", "peak_mib"),
            (f"final loss (last {LOSS_WINDOW})", "{:.4f}", "final_loss")]
    print(f"\n{args.steps} steps on {args.device}, GPT {args.size}; apex = amp {args.opt_level} + FusedAdam + "
          f"Fused{'RMS' if args.norm == 'rms' else 'Layer'}Norm\n(amp {args.opt_level}: {args.opt_level_reason})\n")
    print(f"{'':28}{'plain PyTorch':>16}{'apex':>16}")
    for name, fmt, key in rows:
        print(f"{name:28}{fmt.format(plain[key]):>16}{fmt.format(fused[key]):>16}")


def default_opt_level(device: str) -> tuple[str, str]:
    """The amp opt level the apex run uses on `device`, and why."""
    if device.startswith("cuda"):
        return "O2", "fp16 with fp32 master weights"
    # Without bf16 instructions (AVX512-BF16 / AMX) oneDNN emulates bf16 matmuls: measured on an
    # AVX2 EPYC, O5 ran this demo 5.6x slower than fp32 (15 vs 84 steps/s); O0 keeps fp32.
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "O5", "bf16: this CPU has bf16 matrix instructions"
    return "O0", "fp32: this CPU has no bf16 matrix instructions, where bf16 is slower than fp32"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    has_gpu = torch.cuda.is_available()
    parser.add_argument("--steps", type=int, default=300 if has_gpu else 150)
    parser.add_argument("--device", default="cuda" if has_gpu else "cpu")
    parser.add_argument("--opt-level", default=None,
                        help="amp opt level (default O2 on a GPU; on a CPU O5 with bf16 instructions, else O0)")
    parser.add_argument("--norm", choices=["layer", "rms"], default="layer")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--worker", choices=["plain", "apex"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.opt_level_reason = "chosen with --opt-level"
    if args.opt_level is None:
        args.opt_level, args.opt_level_reason = default_opt_level(args.device)
    args.size = SIZES["cuda" if args.device.startswith("cuda") else "cpu"]
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")
    if args.worker:
        print(json.dumps(run(args.worker, args)))
        return
    print_table({flavor: run_in_fresh_process(flavor, args) for flavor in ("plain", "apex")}, args)


if __name__ == "__main__":
    main()
