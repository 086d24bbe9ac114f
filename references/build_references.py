"""Builds the shipped op references: each module named in REFERENCES,
scripted with torch.jit.script into OUTDIR/<module>.pt, and
OUTDIR/references.list ("OP FILE ULPS" per line), which moerr reads.

    python3 build_references.py OUTDIR

Sources are compiled under their bare file names, so the saved files name no
build or source directory.
"""
import importlib.util
import linecache
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# A module may import an earlier one (npu_fusion_attention_grad imports
# npu_fusion_attention's helpers): each is loaded in this order.
REFERENCES = [
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_grouped_matmul",
    "npu_moe_token_permute",
    "npu_moe_token_permute_grad",
    "npu_moe_token_unpermute",
    "npu_moe_token_unpermute_grad",
    "npu_rms_norm",
    "npu_rms_norm_backward",
    "npu_rotary_mul",
    "npu_rotary_mul_backward",
    "npu_swiglu",
    "npu_swiglu_backward",
]


def load(name):
    """The module `name`.py, registered under its bare file name."""
    path = os.path.join(HERE, name + ".py")
    with open(path) as f:
        source = f.read()
    filename = name + ".py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = filename
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    lines = ["# op file ulps: moerr's shipped references (references/; docs/REFERENCES.md)"]
    for name in REFERENCES:
        module = load(name)
        scripted = torch.jit.script(module.MODULE())
        scripted.save(os.path.join(outdir, name + ".pt"))
        lines.append(f"{module.OP} {name}.pt {module.ULPS}")
    with open(os.path.join(outdir, "references.list"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_references.py OUTDIR")
    main(sys.argv[1])
