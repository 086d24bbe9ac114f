"""`moerr import torch` on files this torch's own torch.save wrote: a
state_dict (an OrderedDict), a training checkpoint with optimizer state,
lists and tuples, views, Parameters, bf16 and fp16, the legacy format; what
is kept as values, what is skipped, what is refused. Each imported tensor's
bytes are read back from the bundle and compared with what was saved.

Run by ctest (import_torch_save) with PYTHONPATH=BUILD/python and
MOERR_BIN=the moerr binary."""
import json
import os
import re
import subprocess
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

import moerr

MOERR = os.environ.get("MOERR_BIN", "moerr")


class UserConfig:  # a class of the saving program: not readable without it
    def __init__(self):
        self.layers = 2


def trained_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    return model, opt


def run(*args):
    return subprocess.run([MOERR, *map(str, args)], capture_output=True, text=True)


def import_torch(src, out, *flags):
    p = run("import", "torch", src, "-o", out, *flags)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def imported(bundle):
    """{op name: the tensor the bundle holds for it}, in op order."""
    b = moerr.Bundle(bundle)
    return {op["name"]: b.tensor(f"act/{op['outputs'][0]['id']}", 0) for op in b.ops(0)}


def flatten(value, path=""):
    """The tensors of a saved object by path, as the importer names them."""
    join = (lambda k: f"{path}.{k}") if path else str
    if isinstance(value, torch.Tensor):
        return {path: value}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out = {}
    for k, v in items:
        if isinstance(v, (dict, list, tuple, torch.Tensor)):
            out.update(flatten(v, join(k)))
    return out


def same_bytes(a, b):
    """Equal dtype, shape and bytes (NaN included)."""
    a, b = a.detach().contiguous(), b.detach().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8),
                                                                     b.view(-1).view(torch.uint8))


def check_tensors(bundle, saved):
    got = imported(bundle)
    expected = flatten(saved)
    assert list(got) == list(expected)  # names and order
    for name, tensor in expected.items():
        assert same_bytes(got[name], tensor), name


def rewrite_record(path, suffix, data):
    """Rewrites the zip `path` with the record ending in `suffix` replaced."""
    with zipfile.ZipFile(path) as z:
        records = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for name, content in records:
            z.writestr(name, data if name.endswith(suffix) else content)


@pytest.mark.parametrize("protocol", [2, 4, 5])  # 2: torch.save's default
def test_a_state_dict_an_ordered_dict(tmp_path, protocol):
    model, _ = trained_model()
    sd = model.state_dict()
    assert isinstance(sd, OrderedDict)
    torch.save(sd, tmp_path / "sd.pt", pickle_protocol=protocol)
    import_torch(tmp_path / "sd.pt", tmp_path / "run")
    check_tensors(tmp_path / "run/rank0.moerr", sd)
    assert list(imported(tmp_path / "run/rank0.moerr")) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    ops = moerr.Bundle(tmp_path / "run/rank0.moerr").ops(0)
    assert ops[0]["module"] == "0"


def test_a_training_checkpoint_with_optimizer_state(tmp_path):
    model, opt = trained_model()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7, "run": "baseline",
            "loss": 0.125, "nan_seen": False, "scheduler": None}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    p = import_torch(tmp_path / "ckpt.pt", tmp_path / "run", "--json")
    summary = json.loads(p.stdout)
    assert summary["skipped"] == []
    bundle = tmp_path / "run/rank0.moerr"
    check_tensors(bundle, ckpt)
    names = list(imported(bundle))
    assert names[:4] == ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"]
    assert "optimizer.state.0.exp_avg" in names and "optimizer.state.3.exp_avg_sq" in names
    assert "optimizer.state.0.step" in names  # Adam keeps its step as a tensor
    values = moerr.Bundle(bundle).annotation("imported_values")
    assert values["step"] == 7
    assert values["run"] == "baseline"
    assert values["loss"] == 0.125
    assert values["nan_seen"] is False
    assert values["scheduler"] is None
    assert values["optimizer.param_groups.0.lr"] == 1e-3
    assert values["optimizer.param_groups.0.betas.1"] == 0.999
    assert values["optimizer.param_groups.0.params.3"] == 3
    assert summary["values"] == len(values)
    note = moerr.Bundle(bundle).annotation("imported_step", 0)
    assert note["values"] == len(values) and note["skipped"] == 0
    # inspect lists them, top-level paths first.
    text = run("inspect", bundle).stdout
    assert "imported_values: %d values that are not tensors" % len(values) in text
    assert "    step = 7\n" in text
    assert "    loss = 0.125\n" in text


def test_lists_tuples_views_and_dtypes(tmp_path):
    x = torch.arange(12.0).reshape(3, 4)
    saved = [x, x.t(), x[1], (x.bfloat16(), x.half() / 3, torch.tensor([True, False])),
             torch.arange(5), torch.nn.Parameter(torch.full((2,), float("nan"))), torch.zeros(0, 3)]
    torch.save(saved, tmp_path / "list.pt")
    import_torch(tmp_path / "list.pt", tmp_path / "run")
    check_tensors(tmp_path / "run/rank0.moerr", saved)
    assert list(imported(tmp_path / "run/rank0.moerr"))[:4] == ["0", "1", "2", "3.0"]
    torch.save((x, {"y": x * 2}), tmp_path / "tuple.pt")
    import_torch(tmp_path / "tuple.pt", tmp_path / "run-tuple")
    check_tensors(tmp_path / "run-tuple/rank0.moerr", (x, {"y": x * 2}))


def test_the_legacy_format(tmp_path):
    model, opt = trained_model()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(ckpt, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    import_torch(tmp_path / "legacy.pt", tmp_path / "run")
    check_tensors(tmp_path / "run/rank0.moerr", ckpt)
    assert moerr.Bundle(tmp_path / "run/rank0.moerr").annotation("imported_values")["epoch"] == 3


def test_unknown_classes_are_skipped_and_named(tmp_path):
    model, _ = trained_model()
    ckpt = {"model": model.state_dict(), "config": UserConfig(), "mask": np.ones(3),
            "best": np.float64(0.5), "spectrum": torch.ones(2, dtype=torch.complex64), "step": 9}
    torch.save(ckpt, tmp_path / "ckpt.pt")
    p = import_torch(tmp_path / "ckpt.pt", tmp_path / "run")
    assert "3 entries not read, skipped:" in p.stdout
    assert re.search(r"config: an? [\w.]*UserConfig object", p.stdout)  # its module: as pytest imported it
    assert "mask: a numpy.ndarray object" in p.stdout
    assert "spectrum: a tensor of dtype ComplexFloat, which moerr does not store" in p.stdout
    bundle = moerr.Bundle(tmp_path / "run/rank0.moerr")
    assert set(bundle.annotation("imported_skipped")) == {"config", "mask", "spectrum"}
    values = bundle.annotation("imported_values")
    assert values["best"] == 0.5 and values["step"] == 9  # a NumPy scalar is a value
    check_tensors(tmp_path / "run/rank0.moerr", {"model": model.state_dict()})


def test_what_is_refused_leaves_nothing_behind(tmp_path):
    model, _ = trained_model()
    torch.save(model, tmp_path / "whole.pt")
    p = run("import", "torch", tmp_path / "whole.pt", "-o", tmp_path / "run")
    assert p.returncode == 2
    assert "holds a torch.nn.modules.container.Sequential object (torch.save of a whole module" in p.stderr
    torch.save({"step": 3}, tmp_path / "no-tensor.pt")
    p = run("import", "torch", tmp_path / "no-tensor.pt", "-o", tmp_path / "run")
    assert p.returncode == 2 and "no tensor to import" in p.stderr, p.stderr
    torch.save(3, tmp_path / "int.pt")
    p = run("import", "torch", tmp_path / "int.pt", "-o", tmp_path / "run")
    assert p.returncode == 2 and "holds an int, not a tensor or a dict, list or tuple" in p.stderr, p.stderr
    # A file cut short, and a pickle cut short: refused by name, no LibTorch assert.
    torch.save({"w": torch.ones(4), "b": torch.ones(1000)}, tmp_path / "cut.pt")
    data = (tmp_path / "cut.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    p = run("import", "torch", tmp_path / "cut.pt", "-o", tmp_path / "run")
    assert p.returncode == 2 and "cut.pt: not a zip archive LibTorch can read" in p.stderr, p.stderr
    torch.save({"w": torch.ones(4)}, tmp_path / "pickle.pt")
    with zipfile.ZipFile(tmp_path / "pickle.pt") as z:
        pickle = next(z.read(n) for n in z.namelist() if n.endswith("/data.pkl"))
    rewrite_record(tmp_path / "pickle.pt", "/data.pkl", pickle[:40])
    p = run("import", "torch", tmp_path / "pickle.pt", "-o", tmp_path / "run")
    assert p.returncode == 2 and "pickle.pt: data.pkl: byte " in p.stderr and "cut short" in p.stderr, p.stderr
    assert "INTERNAL ASSERT" not in p.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_damaged_entry_is_named_and_no_partial_is_left(tmp_path):
    # A directory: the first file is written, the second's storage record is
    # shorter than its tensor. The import fails naming the file and the
    # entry, and removes the partial bundle it had begun.
    (tmp_path / "dumps").mkdir()
    torch.save({"a": torch.ones(3)}, tmp_path / "dumps/x1.pt")
    torch.save({"layers": [torch.ones(2), torch.arange(64.0)]}, tmp_path / "dumps/x2.pt")
    rewrite_record(tmp_path / "dumps/x2.pt", "/data/1", bytes(100))
    p = run("import", "torch", tmp_path / "dumps", "-o", tmp_path / "run")
    assert p.returncode == 2, p.stdout
    assert "x2.pt: layers.1: its storage 1 holds 100 bytes, fewer than 64 elements of Float" in p.stderr, p.stderr
    assert list((tmp_path / "run").glob("*")) == []
    # Its storage record missing altogether.
    with zipfile.ZipFile(tmp_path / "dumps/x2.pt") as z:
        records = [(info.filename, z.read(info)) for info in z.infolist() if not info.filename.endswith("/data/1")]
    with zipfile.ZipFile(tmp_path / "dumps/x2.pt", "w") as z:
        for name, content in records:
            z.writestr(name, content)
    p = run("import", "torch", tmp_path / "dumps/x2.pt", "-o", tmp_path / "run")
    assert p.returncode == 2 and "x2.pt: layers.1: its storage record data/1 is missing" in p.stderr, p.stderr


def test_a_directory_of_files(tmp_path):
    (tmp_path / "dumps").mkdir()
    torch.save({"h": torch.ones(2)}, tmp_path / "dumps/step2.pt")
    torch.save(torch.arange(3), tmp_path / "dumps/step10.pt")
    torch.save({"h": torch.zeros(2), "lr": 0.5}, tmp_path / "dumps/step1.pth")
    import_torch(tmp_path / "dumps", tmp_path / "run")
    got = imported(tmp_path / "run/rank0.moerr")
    assert list(got) == ["step1/h", "step2/h", "step10"]
    assert torch.equal(got["step10"], torch.arange(3))
    assert moerr.Bundle(tmp_path / "run/rank0.moerr").annotation("imported_values") == {"step1/lr": 0.5}
