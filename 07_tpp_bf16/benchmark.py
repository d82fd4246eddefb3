"""Stage 07 in bfloat16 against torch.nn.Linear in bfloat16 and in float32, on one thread in CPU time.

    python 07_tpp_bf16/benchmark.py            # the tour's shapes
    python 07_tpp_bf16/benchmark.py --quick    # the first shape

The tour's bfloat16 section (python -m eml.common.tour) times the same layers on all threads
by the wall clock. On a machine busy with other work, the wall clock measures the other work
(every parallel region waits for a core); this script runs one thread and counts the CPU
seconds the process got, so the ratios between layers stay meaningful. Forward (no_grad) and
forward+backward (gradients of input, weight and bias), GFLOP/s per CPU second, and the
forward+backward speed-up of stage 07 over torch in bf16 and in float32.
"""

import argparse
import time

import torch

from eml.common import timing
from eml.common.tour import cpu_name
from eml.linear_tpp_bf16 import Layer, _C, bf16_path


def cpu_seconds(fn, run_time):
    fn()  # warm-up: kernels, packing, allocations
    calls, start = 0, time.process_time()
    while time.process_time() - start < run_time or calls < 2:
        fn()
        calls += 1
    return (time.process_time() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--run-time", type=float, default=0.5, help="CPU seconds per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = timing.BENCHMARK_SHAPES[:1] if args.quick else timing.BENCHMARK_SHAPES
    print(f"CPU: {cpu_name()}, 1 thread, CPU time; LIBXSMM target {_C.target_arch()}, stage 07's bf16 path: {bf16_path()}")
    print(f"{'layer':<22} {'N x in x out':>16} {'fwd GF/s':>9} {'f+b GF/s':>9} {'x bf16':>7} {'x fp32':>7}")
    for n, i, o in shapes:
        torch.manual_seed(0)
        reference = torch.nn.Linear(i, o)
        layers = {"torch.nn.Linear fp32": (reference, torch.float32),
                  "torch.nn.Linear bf16": (torch.nn.Linear(i, o).bfloat16(), torch.bfloat16),
                  "07 tpp bf16": (Layer(i, o).bfloat16(), torch.bfloat16)}
        flops = 2 * n * i * o
        rates = {}
        for label, (layer, dtype) in layers.items():
            layer.load_state_dict({k: v.to(dtype) for k, v in reference.state_dict().items()})
            x = torch.randn(n, i, dtype=dtype, requires_grad=True)
            gy = torch.randn(n, o, dtype=dtype)
            params = [x, *layer.parameters()]

            def forward():
                with torch.no_grad():
                    layer(x)

            forward_s = cpu_seconds(forward, args.run_time)
            training_s = cpu_seconds(lambda: torch.autograd.grad(layer(x), params, gy), args.run_time)
            rates[label] = (flops / forward_s * 1e-9, 3 * flops / training_s * 1e-9)
        for label, (fwd, fb) in rates.items():
            print(f"{label:<22} {'x'.join(map(str, (n, i, o))):>16} {fwd:>9.1f} {fb:>9.1f}"
                  f" {fb / rates['torch.nn.Linear bf16'][1]:>7.2f} {fb / rates['torch.nn.Linear fp32'][1]:>7.2f}", flush=True)
        print()


if __name__ == "__main__":
    main()
