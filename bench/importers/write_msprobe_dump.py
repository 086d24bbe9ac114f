"""Writes dumps in msprobe's PyTorch layout (docs/IMPORT.md, "Sources") of
one forward pass of a small MLP block, for trying `moerr import msprobe`
without an Ascend machine: each call's statistics are computed as msprobe
computes them (Max, Min, Mean, Norm; Max_except_inf_nan when not finite) and,
for --task tensor, each value saved with torch.save under dump_tensor_data/.

    write_msprobe_dump.py OUT [--task statistics|tensor] [--ranks 2] [--fp16]

--fp16 rounds every call's output to float16, as a device computing in
fp16 would hold it: the block's scaled activations then overflow."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def finite_extreme(t, largest):
    if torch.isnan(t).all():
        return float("nan")
    finite = t[torch.isfinite(t)]
    if finite.numel():
        return (finite.max() if largest else finite.min()).item()
    rest = t[~torch.isnan(t)]
    return (rest.max() if largest else rest.min()).item()


def stats(t, data_name):
    d = t if t.is_floating_point() and t.dtype != torch.float64 else t.float()
    out = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "Max": d.max().item(),
           "Min": d.min().item(), "Mean": d.mean().item(), "Norm": d.norm().item(), "requires_grad": t.requires_grad}
    if not math.isfinite(out["Max"]):
        out["Max_except_inf_nan"] = finite_extreme(t, True)
    if not math.isfinite(out["Min"]):
        out["Min_except_inf_nan"] = finite_extreme(t, False)
    if data_name:
        out["data_name"] = data_name
    return out


class Dump:
    def __init__(self, root, task):
        self.root, self.task, self.data, self.construct, self.counts = root, task, {}, {}, {}
        os.makedirs(os.path.join(root, "dump_tensor_data") if task == "tensor" else root, exist_ok=True)

    def value(self, t, name):
        if not isinstance(t, torch.Tensor):
            return {"type": type(t).__name__, "value": t}
        file = f"{name}.pt" if self.task == "tensor" else ""
        if file:
            torch.save(t.detach().clone().contiguous(), os.path.join(self.root, "dump_tensor_data", file))
        return stats(t.detach(), file)

    def call(self, api, fn, args, module, fp16):
        n = self.counts.get(api, 0)
        self.counts[api] = n + 1
        name = f"{api}.{n}.forward"
        out = fn(*[a.float() if isinstance(a, torch.Tensor) else a for a in args])
        if fp16:
            out = out.half()
        self.data[name] = {"input_args": [self.value(a, f"{name}.input.{i}") for i, a in enumerate(args)],
                           "input_kwargs": {}, "output": [self.value(out, f"{name}.output.0")]}
        self.construct[name] = module
        return out

    def write(self):
        with open(os.path.join(self.root, "dump.json"), "w") as f:
            json.dump({"task": self.task, "level": "mix", "framework": "pytorch",
                       "dump_data_dir": os.path.join(self.root, "dump_tensor_data") if self.task == "tensor" else None,
                       "data": self.data}, f, indent=1)
        with open(os.path.join(self.root, "construct.json"), "w") as f:
            json.dump(self.construct, f, indent=1)
        with open(os.path.join(self.root, "stack.json"), "w") as f:
            json.dump({str(i): [[k], [f"File \"train.py\", line {10 + i}, in forward"]]
                       for i, k in enumerate(self.data)}, f, indent=1)


def main():
    out, task = sys.argv[1], arg("--task", "statistics")
    ranks, fp16 = int(arg("--ranks", "2")), "--fp16" in sys.argv
    for rank in range(ranks):
        torch.manual_seed(rank)
        d = Dump(os.path.join(out, "step0", f"rank{rank}"), task)
        x = torch.randn(16, 64)
        w_up, w_down = torch.randn(256, 64) * 0.5, torch.randn(64, 256) * 0.5
        for layer in range(2):
            mlp = f"Module.layers.{layer}.mlp.MLP.forward.0"
            x = x.half() if fp16 else x
            h = d.call("Functional.linear", F.linear, [x, w_up.to(x.dtype)], f"Module.layers.{layer}.mlp.up.Linear.forward.0", fp16)
            g = d.call("Functional.gelu", F.gelu, [h], mlp, fp16)
            y = d.call("Functional.linear", F.linear, [g, w_down.to(g.dtype)], f"Module.layers.{layer}.mlp.down.Linear.forward.0", fp16)
            # An unnormalised residual scaled by 64: past fp16's range in layer 1.
            x = d.call("Tensor.__mul__", torch.mul, [y, 64.0], mlp, fp16)
        d.call("Functional.softmax", lambda t: F.softmax(t, dim=-1), [x], None, fp16)
        d.write()
    print(f"wrote {ranks} rank(s) of task {task}{' (fp16)' if fp16 else ''} under {out}")


if __name__ == "__main__":
    main()
