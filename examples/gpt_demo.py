"""Train a small Llama-style model with the strongest plain-PyTorch eager setup and with apex, timed
in interleaved blocks, and compare steps/s, peak memory and final loss.

    python examples/gpt_demo.py [--device cpu|cuda] [--rounds N] [--block-steps N] [--compile | --no-compile]

torch eager    torch.autocast bf16 on a GPU (fp16 + GradScaler where it lacks bf16); on a CPU the
               faster of float32 and autocast bf16, measured. torch.optim.AdamW(fused=True),
               nn.RMSNorm (F.rms_norm), RoPE and SwiGLU in PyTorch ops, F.cross_entropy.
apex           amp (the faster of O5/O4 on a bf16 GPU, O2/O1 on an fp16 one, O0/O4/O5 on a CPU,
               measured) + FusedAdam + FusedRMSNorm + fused RoPE + fused SwiGLU, and
               apex.contrib.xentropy's fused cross entropy when it is importable.
torch.compile  the torch eager setup with torch.compile(model) (default: on a GPU only; compiling
               on a small CPU takes minutes).

Attention is F.scaled_dot_product_attention in every run. Each run lives in its own process (its
own memory peak); the parent has them train in alternating blocks of steps, so all see the same
machine state (clocks, other load), and the first block of each is warm-up, left out of steps/s.
Precision choices marked "measured" were timed over a few steps in separate processes first.
The task is synthetic (no download): character-level addition problems such as "417+38=455;".
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# Runnable from a source checkout too: apex and its compiled-module faces come from there.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[1:1] = [_REPO, os.path.join(_REPO, "compatibility")]
from llama_model import Llama, apex_parts, torch_parts  # noqa: E402

VOCAB = "0123456789+=;"
# Sized to run in seconds per block on a 2-core CPU, and to give a GPU real work.
SIZES = {"cpu": dict(dim=64, heads=4, layers=2, hidden=176, context=32, batch=16),
         "cuda": dict(dim=512, heads=8, layers=8, hidden=1408, context=512, batch=32)}
LR, WEIGHT_DECAY = 3e-3, 0.01
LOSS_WINDOW = 10  # the final loss is a mean over the last steps: single-batch losses are noisy
# Calibration of a precision choice: untimed steps, then timed ones.
CALIBRATION = {"cpu": (3, 8), "cuda": (10, 30)}

PRECISIONS = {
    "fp32": "float32",
    "bf16": "torch.autocast bfloat16",
    "fp16": "torch.autocast float16 + GradScaler",
    "O0": "amp O0: float32",
    "O1": "amp O1: float16 casts around torch functions, dynamic loss scaling",
    "O2": "amp O2: float16 weights, float32 master weights, dynamic loss scaling",
    "O4": "amp O4: bfloat16 casts around torch functions",
    "O5": "amp O5: bfloat16 weights, float32 master weights",
}


def addition_corpus(problems=20000, seed=0):
    """One long token stream of "a+b=c;" problems, a and b below 1000."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, 1000, (2, problems), generator=gen)
    text = "".join(f"{x}+{y}={x + y};" for x, y in zip(a.tolist(), b.tolist()))
    return torch.tensor([VOCAB.index(c) for c in text])


def batches(corpus, device, context, batch, seed=1):
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(corpus) - context - 1, (batch,), generator=gen)
        window = torch.stack([corpus[s:s + context + 1] for s in starts.tolist()]).to(device)
        yield window[:, :-1], window[:, 1:]


# ---- one training run (a worker process) ------------------------------------------------------------

class Run:
    """A model, its optimizer and its training step, as one flavor and precision set them up."""

    def __init__(self, flavor: str, precision: str, device: str):
        self.device, self.cuda = device, device.startswith("cuda")
        size = SIZES["cuda" if self.cuda else "cpu"]
        torch.manual_seed(0)
        parts = apex_parts() if flavor == "apex" else torch_parts()
        model = Llama(len(VOCAB), size["context"], dim=size["dim"], heads=size["heads"], layers=size["layers"],
                      hidden=size["hidden"], parts=parts).to(device)
        self.batches = batches(addition_corpus(), device, size["context"], size["batch"])
        self.losses = collections.deque(maxlen=LOSS_WINDOW)
        if flavor == "apex":
            self.step, self.used = self._apex(model, precision)
        else:
            self.step, self.used = self._torch(model, precision, compiled=flavor == "torch.compile")

    def _torch(self, model, precision, compiled):
        device_type = "cuda" if self.cuda else "cpu"
        dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        try:  # fused AdamW: CUDA, and CPU since torch 2.4
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
            adamw = "torch.optim.AdamW(fused=True)"
        except (RuntimeError, TypeError):
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            adamw = "torch.optim.AdamW (no fused kernel on this device)"
        scaler = torch.amp.GradScaler(device_type) if precision == "fp16" else None
        forward = torch.compile(model) if compiled else model

        def step(tokens, targets):
            with torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
                logits = forward(tokens)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            return loss

        used = f"{PRECISIONS[precision]}, {adamw}, nn.RMSNorm (F.rms_norm), RoPE and SwiGLU in PyTorch ops, F.cross_entropy"
        return step, ("torch.compile(model) of: " if compiled else "") + used

    def _apex(self, model, opt_level):
        from apex import amp
        from apex.optimizers import FusedAdam

        optimizer = FusedAdam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, adam_w_mode=True)
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, combine_grad=True, verbosity=0)
        try:
            from apex.contrib.xentropy import softmax_cross_entropy
            loss_name = "apex.contrib.xentropy fused cross entropy"
        except ImportError:
            softmax_cross_entropy = None
            loss_name = "F.cross_entropy (apex.contrib.xentropy is not importable here)"

        def step(tokens, targets):
            logits = model(tokens)
            flat, labels = logits.view(-1, logits.shape[-1]), targets.reshape(-1)
            if softmax_cross_entropy is not None:
                loss = softmax_cross_entropy(flat, labels, reduction="mean")
            else:
                loss = F.cross_entropy(flat.float(), labels)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            return loss

        return step, f"{PRECISIONS[opt_level]}, FusedAdam, FusedRMSNorm, fused RoPE, fused SwiGLU, {loss_name}"

    def train(self, steps: int) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            self.losses.append(self.step(*next(self.batches)).detach())  # no .item(): no host sync per step
        if self.cuda:
            torch.cuda.synchronize()
        return {"seconds": time.perf_counter() - start, "loss": self.losses[-1].item()}

    def summary(self) -> dict:
        peak = (torch.cuda.max_memory_allocated() if self.cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # ru_maxrss: KiB on Linux
        return {"peak_mib": peak / 2**20, "final_loss": torch.stack(list(self.losses)).float().mean().item(),
                "used": self.used}


def serve(flavor: str, precision: str, device: str) -> None:
    """Worker loop: a line "N" trains N steps and answers {"seconds", "loss"}; "done" answers the summary."""
    run = Run(flavor, precision, device)
    for line in sys.stdin:
        command = line.strip()
        reply = run.summary() if command == "done" else run.train(int(command))
        print(json.dumps(reply), flush=True)
        if command == "done":
            return


class Worker:
    """A run in its own process, driven one block of steps at a time."""

    def __init__(self, flavor: str, precision: str, device: str):
        command = [sys.executable, os.path.abspath(__file__), "--serve", flavor, precision, "--device", device]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:  # the reply is the first JSON line (anything else is passed on)
            if line.startswith("{"):
                return json.loads(line)
            sys.stderr.write(line)
        raise RuntimeError(f"a demo worker exited (status {self.process.wait()}); its error is above")

    def finish(self) -> dict:
        summary = self.ask("done")
        self.process.wait()
        return summary


# ---- choosing precisions, and the comparison --------------------------------------------------------

def candidates(flavor: str, device: str) -> list[str]:
    if device.startswith("cuda"):
        bf16 = torch.cuda.is_bf16_supported()
        if flavor == "apex":
            return ["O5", "O4"] if bf16 else ["O2", "O1"]
        return ["bf16"] if bf16 else ["fp16"]
    return ["O0", "O4", "O5"] if flavor == "apex" else ["fp32", "bf16"]


def choose_precision(flavor: str, device: str, forced: str | None) -> tuple[str, str]:
    """The precision a flavor runs in, and why: forced, the only candidate, or the fastest measured."""
    if forced:
        return forced, "chosen with a command-line option"
    options = candidates(flavor, device)
    if len(options) == 1:
        return options[0], "the strongest setup on this device"
    warmup, timed = CALIBRATION["cuda" if device.startswith("cuda") else "cpu"]
    rates = {}
    for precision in options:
        worker = Worker(flavor, precision, device)
        worker.ask(str(warmup))
        rates[precision] = timed / worker.ask(str(timed))["seconds"]
        worker.finish()
    best = max(rates, key=rates.get)
    measured = ", ".join(f"{p} {rate:.1f}" for p, rate in rates.items())
    return best, f"measured the fastest here (steps/s over {timed} steps: {measured})"


def cpu_note() -> str:
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return ("this CPU has bf16 instructions (AVX512-BF16/AMX): bf16 matmuls run natively, but casts and "
            "16-bit elementwise work can still cost more than they save" if bf16 else
            "this CPU has no bf16 instructions: oneDNN emulates bf16 matmuls, usually slower than float32")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    has_gpu = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if has_gpu else "cpu")
    parser.add_argument("--rounds", type=int, default=12 if has_gpu else 16,
                        help="blocks per run (the first is warm-up)")
    parser.add_argument("--block-steps", type=int, default=25 if has_gpu else 10)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time torch.compile(model) (default: on a GPU only)")
    parser.add_argument("--opt-level", help="apex's amp opt level (default: measured)")
    parser.add_argument("--torch-precision", choices=["fp32", "bf16", "fp16"], help="the torch runs' (default: measured)")
    parser.add_argument("--serve", nargs=2, metavar=("FLAVOR", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve, args.device)
        return
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first block is warm-up)")
    cuda = args.device.startswith("cuda")
    compiled = has_gpu and cuda if args.compile is None else args.compile

    torch_precision, torch_why = choose_precision("torch", args.device, args.torch_precision)
    opt_level, apex_why = choose_precision("apex", args.device, args.opt_level)
    flavors = {"torch eager": ("torch", torch_precision), "apex": ("apex", opt_level)}
    if compiled:
        flavors["torch.compile"] = ("torch.compile", torch_precision)
    workers = {name: Worker(flavor, precision, args.device) for name, (flavor, precision) in flavors.items()}
    seconds = dict.fromkeys(workers, 0.0)
    for round_ in range(args.rounds):
        line = []
        for name, worker in workers.items():
            reply = worker.ask(str(args.block_steps))
            if round_ > 0:  # the first block is warm-up (allocations, kernel loading, compilation)
                seconds[name] += reply["seconds"]
            line.append(f"{name} {args.block_steps / reply['seconds']:.1f} steps/s (loss {reply['loss']:.3f})")
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(line), file=sys.stderr, flush=True)
    summaries = {name: worker.finish() for name, worker in workers.items()}

    timed_steps = (args.rounds - 1) * args.block_steps
    size = SIZES["cuda" if cuda else "cpu"]
    where = torch.cuda.get_device_name() if cuda else f"CPU ({os.cpu_count()} cores)"
    print(f"\n{args.rounds * args.block_steps} steps per run on {where}; Llama dim {size['dim']}, {size['layers']} layers, "
          f"{size['heads']} heads, SwiGLU {size['hidden']}, batch {size['batch']} x {size['context']} tokens;\n"
          f"timed as {args.rounds} interleaved blocks of {args.block_steps} steps (the first of each run is warm-up)\n")
    rows = [("steps/s", lambda name, s: f"{timed_steps / seconds[name]:.2f}"),
            ("peak GPU memory (MiB)" if cuda else "peak RSS (MiB)", lambda name, s: f"{s['peak_mib']:.1f}"),
            (f"final loss (last {LOSS_WINDOW})", lambda name, s: f"{s['final_loss']:.4f}")]
    print(f"{'':26}" + "".join(f"{name:>16}" for name in workers))
    for label, cell in rows:
        print(f"{label:26}" + "".join(f"{cell(name, summaries[name]):>16}" for name in workers))
    baseline = timed_steps / seconds["torch eager"]
    print(f"\napex vs torch eager: {timed_steps / seconds['apex'] / baseline:.2f}x steps/s\nwhat each run used:")
    for name, summary in summaries.items():
        print(f"  {name}: {summary['used']}")
    print(f"precision choices: torch {torch_precision} ({torch_why}); apex {opt_level} ({apex_why})")
    if not cuda:
        print(f"  ({cpu_note()})")


if __name__ == "__main__":
    main()
