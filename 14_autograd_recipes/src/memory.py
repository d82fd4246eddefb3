"""Stage 14: how much memory the fused conv+BN saves, measured on the CPU.

    python -m eml.autograd_recipes.memory            # the figures quoted in the README
    python -m eml.autograd_recipes.memory --quick    # a small net, seconds (a smoke test)

Four versions of one small convolutional net (two conv+BN+ReLU blocks, max pooling, two linear
layers; MNIST-sized 1x28x28 inputs generated at random, nothing downloaded), with the same
initial weights:
  torch   nn.Conv2d(bias=False) + nn.BatchNorm2d
  pieces  our Conv2dFunction then our BatchNormFunction (FusedConvBN(fused=False))
  fused   our FusedConvBNFunction (FusedConvBN)
  fused_formula  the same, its weight gradient by the transposed-convolution formula, which
          copies x and g before convolving them (conv_bn.conv2d_weight_grad_by_formula)

Three measurements, each saying what it counts:
  1. saved for backward: every tensor that autograd keeps from the forward to the backward
     passes through torch.autograd.graph.saved_tensors_hooks; we add up the bytes of the
     distinct storages they live in (a tensor saved twice, or a view of one, counts once),
     split into parameters and activations. Exact and deterministic.
  2. torch allocator peak: torch.profiler(profile_memory=True) records every CPU allocation
     and free torch makes; the running sum's maximum over a few training steps (forward,
     backward, SGD step), above what was allocated before them. Includes temporaries, such as
     the convolution the fused backward recomputes.
  3. process peak RSS: the operating system's high-water mark (VmHWM, reset just before the
     steps) of a fresh process running the same steps (after a warm-up step on a batch of 2), minus its resident
     size just before them; the median of 3 processes. Includes everything, glibc's heap
     keeping freed memory and per-thread malloc arenas too: the coarsest and noisiest of the
     three (the script prints every run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from eml.common.timing import cpu_name  # the CPU with its family, model and vector extension

from .conv_bn import FusedConvBN, FusedConvBNFunctionByFormula

KINDS = ("torch", "pieces", "fused", "fused_formula")


# ---- 1. The net, in four versions with the same weights ----
def make_net(kind, channels=(32, 64), image=28, classes=10, seed=0):
    """The same net for every kind: each (Conv2d, BatchNorm2d) pair replaced by FusedConvBN unless kind == 'torch'."""
    if kind not in KINDS:
        raise ValueError(f"memory: expected a kind among {KINDS}, got {kind!r}")
    torch.manual_seed(seed)
    layers, in_channels, size = [], 1, image
    for out_channels in channels:
        layers += [torch.nn.Conv2d(in_channels, out_channels, 3, bias=False), torch.nn.BatchNorm2d(out_channels), torch.nn.ReLU()]
        in_channels, size = out_channels, size - 2
    layers += [torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(in_channels * (size // 2) ** 2, 128),
               torch.nn.ReLU(), torch.nn.Linear(128, classes)]
    if kind != "torch":  # swap each (Conv2d, BatchNorm2d) pair, once every layer holds its initial weights
        for i in reversed([i for i, layer in enumerate(layers) if isinstance(layer, torch.nn.Conv2d)]):
            layers[i:i + 2] = [FusedConvBN.from_modules(layers[i], layers[i + 1], fused=(kind != "pieces"))]
            if kind == "fused_formula":
                layers[i].function = FusedConvBNFunctionByFormula
    return torch.nn.Sequential(*layers)


def make_data(batch, image=28, classes=10, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 1, image, image, generator=generator), torch.randint(classes, (batch,), generator=generator)


# ---- 2. Bytes saved for backward ----
def saved_bytes(net, input, target):
    """{'parameters': bytes, 'activations': bytes, 'tensors': count} saved for backward by one forward."""
    storages = {}  # storage address -> nbytes: each storage once, however many tensors share it

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        pack.count += 1
        return tensor

    pack.count = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = F.cross_entropy(net(input), target)
    del loss
    parameters = {p.untyped_storage().data_ptr() for p in net.parameters()}
    in_parameters = sum(n for address, n in storages.items() if address in parameters)
    return {"parameters": in_parameters, "activations": sum(storages.values()) - in_parameters, "tensors": pack.count}


# ---- 3. Peak memory of a few training steps ----
def train(net, input, target, steps):
    """`steps` SGD steps; the gradients are freed at the end, so each call starts and ends clean."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(input), target).backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def allocator_peak(net, input, target, steps):
    """Peak bytes held by torch's CPU allocations during `steps` steps, above those held before.

    Every block freed inside the profiled steps was allocated inside them (train() frees the
    gradients before it returns), so the running sum is exact."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train(net, input, target, steps)
    events = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                    if event.name() == "[memory]")
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


def rss_bytes():
    """Resident size of this process now (Linux: /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes():
    """The process's peak resident size (Linux: VmHWM in /proc/self/status, in kB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def child(kind, batch, steps, channels):
    """Run in a fresh process: peak RSS of the steps above the resident size before them.

    One warm-up step on a batch of 2 first loads what torch initializes lazily on a first
    training step (thread pools, oneDNN, the autograd engine), which would otherwise dwarf the
    tensors' memory. Then the peak is reset (writing 5 to /proc/self/clear_refs, Linux >= 4.0)
    so it covers the steps only. Not getrusage's ru_maxrss: that one survives fork and exec, so
    a child of a big process starts with its parent's peak (measured: 871 MiB before any step)."""
    net, (input, target) = make_net(kind, channels), make_data(batch)
    train(net, *make_data(2), 1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_bytes()
    train(net, input, target, steps)
    print(json.dumps({"rss_peak_increase": peak_rss_bytes() - before}))


def rss_peak(kind, batch, steps, channels):
    """child()'s figure, from a fresh process."""
    code = f"from eml.autograd_recipes.memory import child; child({kind!r}, {batch}, {steps}, {tuple(channels)!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["rss_peak_increase"]


# ---- 4. The report ----
def measure(batch=128, steps=3, channels=(32, 64), rss=3):
    """{kind: {figure: bytes}} for the four versions of the net."""
    input, target = make_data(batch)
    results = {}
    for kind in KINDS:
        figures = saved_bytes(make_net(kind, channels), input, target)
        net = make_net(kind, channels)
        train(net, input, target, 1)  # warm-up: first-call allocations stay out of the peak
        figures["allocator_peak"] = allocator_peak(net, input, target, steps)
        if rss:  # noisy (threads allocate from their own malloc arenas): the median of `rss` processes
            figures["rss_runs"] = sorted(rss_peak(kind, batch, steps, channels) for _ in range(rss))
            figures["rss_peak_increase"] = figures["rss_runs"][len(figures["rss_runs"]) // 2]
        results[kind] = figures
    return results


def mib(nbytes):
    return f"{nbytes / 2**20:8.1f} MiB"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small net and batch, no subprocesses")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rss-runs", type=int, default=3, help="fresh processes per kind for the RSS figure (median)")
    args = parser.parse_args(argv)
    batch, channels = (8, (4, 8)) if args.quick else (args.batch, (32, 64))
    results = measure(batch, args.steps, channels, rss=0 if args.quick else args.rss_runs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU: {cpu_name()}")
    print(f"net: conv{channels[0]}+BN+ReLU, conv{channels[1]}+BN+ReLU, maxpool, linear 128, linear 10; "
          f"batch {batch} x 1x28x28 float32, {args.steps} SGD steps")
    rows = [("saved for backward: activations", "activations"), ("saved for backward: parameters", "parameters"),
            ("torch allocator peak, training steps", "allocator_peak")]
    if not args.quick:
        rows.append((f"process peak RSS increase, median of {args.rss_runs}", "rss_peak_increase"))
    print(f"{'':38}" + "".join(f"{kind:>14}" for kind in KINDS) + "   fused/torch")
    for label, key in rows:
        values = [results[kind][key] for kind in KINDS]
        print(f"{label:38}" + "".join(f"{mib(v):>14}" for v in values) + f"   {values[2] / values[0]:10.2f}")
    print(f"{'tensors saved for backward (count)':38}" + "".join(f"{results[kind]['tensors']:>14}" for kind in KINDS))
    if not args.quick:
        print("RSS runs (MiB): " + "; ".join(f"{kind} " + " ".join(f"{v / 2**20:.0f}" for v in results[kind]["rss_runs"])
                                             for kind in KINDS))
    return results


if __name__ == "__main__":
    main()
