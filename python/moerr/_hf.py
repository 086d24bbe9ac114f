"""moerr.record(..., model=, hf_config=): what `moerr replay RUN --ranks M`
needs to rebuild a Python loop's model (docs/DISTRIBUTED.md, "Python").

At the first step recorded, each rank writes RUN/hf/rank<K>.safetensors:
  param/<HF name>   the parameters this rank holds as the step begins, a
                    local expert under its global index (the block's
                    `expert_offset` plus its index in `experts`); fused
                    experts (transformers 5's experts.gate_up_proj and
                    experts.down_proj) split per expert (split_fused);
  batch/input_ids   the model's input [B, S] int64 (the root module's
                    first argument, or its input_ids=);
  out/<module>      each decoder layer's output (`model.layers.<i>`) and
                    the logits (`out/logits`), fp32;
  out/loss          the objective on those logits: causal-LM next-token
                    cross entropy, mean over the B*(S-1) predictions;
  grad/<HF name>    what the step's backward gave each parameter (its
                    gradient hooks, summed), before any collective: a dense
                    parameter's gradient of this rank's loss, an expert's
                    of every loss whose rows reached it;
and the bundle's annotation "hf_model" names the file, the step, the HF
config and the objective; a step it cannot capture (the forward ran other
than once, no backward reached the model) warns and annotates
"hf_model_unwritten" with why, which `replay --ranks` reports. Only that
objective is supported: a loop whose loss is another is reported by the
replay's gradient comparison.
"""
import ctypes
import json
import os
import re
import struct
import warnings

import torch

FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3")
OBJECTIVE = "causal-lm-cross-entropy"

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}

# Parameter names of the families (HF's), a layer's number and an expert's as \d+.
_COMMON = [r"model\.embed_tokens\.weight", r"model\.norm\.weight", r"lm_head\.weight",
           r"model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight",
           r"model\.layers\.\d+\.self_attn\.(q|k|v)_proj\.(weight|bias)", r"model\.layers\.\d+\.self_attn\.o_proj\.weight"]
_NAMES = {
    "mixtral": [r"model\.layers\.\d+\.block_sparse_moe\.gate\.weight",
                r"model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w[123]\.weight"],
    "qwen2_moe": [r"model\.layers\.\d+\.mlp\.gate\.weight",
                  r"model\.layers\.\d+\.mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj\.weight",
                  r"model\.layers\.\d+\.mlp\.shared_expert_gate\.weight"],
    "qwen3_moe": [r"model\.layers\.\d+\.self_attn\.(q|k)_norm\.weight", r"model\.layers\.\d+\.mlp\.gate\.weight",
                  r"model\.layers\.\d+\.mlp\.(experts\.\d+\.)?(gate|up|down)_proj\.weight"],
    "deepseek_v3": [r"model\.layers\.\d+\.self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)\.weight",
                    r"model\.layers\.\d+\.self_attn\.(q_a_layernorm|kv_a_layernorm)\.weight",
                    r"model\.layers\.\d+\.mlp\.gate\.(weight|e_score_correction_bias)",
                    r"model\.layers\.\d+\.mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down)_proj\.weight"],
}
_LAYER = re.compile(r"model\.layers\.\d+")


# transformers 5 holds a block's experts fused, as 3-D parameters of its
# `experts` module: gate_up_proj [E, 2I, H] (the gate's I rows, then the up
# projection's) and down_proj [E, H, I]. They are split per expert into the
# names moerr rebuilds (Mixtral's w1, w3, w2; the others' gate/up/down_proj).
_FUSED = re.compile(r"(.*\.experts)\.(gate_up_proj|down_proj)")
_PER_EXPERT = {"mixtral": ("w1", "w3", "w2")}


def split_fused(name, t, family=None, offset=0):
    """(HF name, tensor) pairs of the parameter (or gradient) `t` named
    `name`: itself, or a fused experts tensor as one per expert and matrix,
    expert j under index `offset` + j."""
    m = _FUSED.fullmatch(name)
    if m is None or t.dim() != 3:
        return [(name, t)]
    gate, up, down = _PER_EXPERT.get(family, ("gate_proj", "up_proj", "down_proj"))
    out = []
    for j in range(t.shape[0]):
        prefix = f"{m.group(1)}.{offset + j}."
        if m.group(2) == "down_proj":
            out.append((prefix + down + ".weight", t[j]))
        else:
            half = t.shape[1] // 2
            out += [(prefix + gate + ".weight", t[j, :half]), (prefix + up + ".weight", t[j, half:])]
    return out


def expert_offsets(model):
    """{name: expert_offset} of the modules of `model` holding an `experts`
    module (0 where the block sets none)."""
    return {name: int(getattr(m, "expert_offset", 0)) for name, m in model.named_modules()
            if isinstance(getattr(m, "experts", None), torch.nn.Module)}


def global_name(name, offsets):
    """(name, offset): `name`, a parameter's or a module's, with a local
    expert `...experts.<j>...` of a block with expert_offset o (`offsets`,
    expert_offsets') named `...experts.<o + j>...`, and that block's offset
    (0 outside any block)."""
    for block, o in offsets.items():
        prefix = (block + "." if block else "") + "experts."
        if name.startswith(prefix):
            local, dot, rest = name[len(prefix):].partition(".")
            if o and local.isdigit():
                return f"{prefix}{int(local) + o}{dot}{rest}", o
            return name, o
    return name, 0


def hf_parameters(model, family=None):
    """(parameter, its HF name, expert offset) of `model`: a local
    expert `...experts.<j>...` of a block with `expert_offset` named
    `...experts.<expert_offset + j>...`; split_fused(name, p, family, offset)
    gives its HF tensors."""
    offsets = expert_offsets(model)
    return [(p, *global_name(name, offsets)) for name, p in model.named_parameters()]


def hf_names(model, family=None):
    """(HF name, tensor) of `model`, fused experts split per expert."""
    return [pair for p, hf, offset in hf_parameters(model, family) for pair in split_fused(hf, p, family, offset)]


def check_model(model, hf_config):
    """Raises ValueError naming what keeps moerr from rebuilding `model` under
    `hf_config`: an unknown model_type, or parameters outside the family's names."""
    if not isinstance(hf_config, dict):
        raise ValueError(f"hf_config must be a dict (config.json's keys), not {type(hf_config).__name__}")
    try:
        json.dumps(hf_config)  # written into the bundle's annotation at the step's end
    except (TypeError, ValueError) as e:
        raise ValueError(f"hf_config must be config.json's keys, JSON values only: {e}") from None
    family = hf_config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"hf_config model_type {family!r}: moerr rebuilds {', '.join(FAMILIES)} only")
    patterns = [re.compile(p) for p in _COMMON + _NAMES[family]]
    named = hf_names(model, family)
    bad = [n for n, _ in named if not any(p.fullmatch(n) for p in patterns)]
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise ValueError(f"model: {len(bad)} parameters are not {family} names (HF's, e.g. "
                         f"model.layers.0.self_attn.q_proj.weight): {shown}")
    experts = hf_config.get("num_local_experts", hf_config.get("num_experts", hf_config.get("n_routed_experts")))
    for n, _ in named:
        m = re.search(r"\.experts\.(\d+)\.", n)
        if m and experts is not None and int(m.group(1)) >= int(experts):
            raise ValueError(f"model: {n}: expert {m.group(1)} of {experts} (is the block's expert_offset right?)")
    try:
        wrong = [f"{n} {list(p.shape)} (the config: {want})" for n, p in named
                 for want in [_expected_shape(n, hf_config)] if want is not None and list(p.shape) != want]
    except KeyError as e:
        raise ValueError(f"hf_config lacks {e.args[0]!r}, which {family} needs") from None
    if wrong:
        raise ValueError(f"model: {len(wrong)} parameters have shapes the hf_config does not give them: "
                         + ", ".join(wrong[:8]) + (f" and {len(wrong) - 8} more" if len(wrong) > 8 else ""))


def _expected_shape(name, c):
    """The shape `c` gives the parameter `name`, for the tensors every GQA
    family shares and the routed experts (None: not checked here; the
    replay's strict load checks every tensor)."""
    if c["model_type"] == "deepseek_v3":
        return None
    d, heads = c["hidden_size"], c["num_attention_heads"]
    hd, kv = c.get("head_dim") or d // heads, c.get("num_key_value_heads", heads)
    expert_width = c.get("moe_intermediate_size", c.get("intermediate_size"))
    experts = c.get("num_local_experts", c.get("num_experts"))
    rules = [(r"model\.embed_tokens\.weight|lm_head\.weight", [c["vocab_size"], d]),
             (r"model\.norm\.weight|model\.layers\.\d+\.(input|post_attention)_layernorm\.weight", [d]),
             (r".*self_attn\.q_proj\.weight", [heads * hd, d]), (r".*self_attn\.(k|v)_proj\.weight", [kv * hd, d]),
             (r".*self_attn\.o_proj\.weight", [d, heads * hd]), (r".*(mlp|block_sparse_moe)\.gate\.weight", [experts, d]),
             (r".*\.experts\.\d+\.(w1|w3|gate_proj|up_proj)\.weight", [expert_width, d]),
             (r".*\.experts\.\d+\.(w2|down_proj)\.weight", [d, expert_width])]
    for pattern, shape in rules:
        if re.fullmatch(pattern, name):
            return shape
    return None


def write_safetensors(path, tensors, metadata):
    """`tensors` (name -> CPU tensor) in the safetensors format, through a
    .partial file and a rename."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{path}: {name} is {t.dtype}; moerr writes {', '.join(map(str, _DTYPES))}")
        data = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())  # t is contiguous, on the CPU
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".partial", path)


class Capture:
    """Captures the first recorded step of `model` on this rank (module
    docstring) and writes it when the step ends."""

    def __init__(self, model, hf_config, run_dir, rank):
        check_model(model, hf_config)
        self._model, self._config = model, hf_config
        self._file = os.path.join("hf", f"rank{rank}.safetensors")
        self._path = os.path.join(str(run_dir), self._file)
        self._hooks, self._done, self._forwards = [], False, 0
        self._tensors = {}
        self._logits_dtype = None  # the logits' dtype as the loop computed them ("float32", "bfloat16", ...)

    def begin(self):
        if self._done:
            return
        with _untraced():
            self._begin()

    def _begin(self):
        t = self._tensors
        family = self._config["model_type"]
        for p, hf, offset in hf_parameters(self._model, family):
            for name, view in split_fused(hf, p, family, offset):
                t["param/" + name] = view.detach().clone()
            if p.requires_grad:  # a frozen parameter has no gradient to record
                self._hooks.append(p.register_hook(self._grad_hook(hf, family, offset)))
        self._hooks.append(self._model.register_forward_pre_hook(self._input_hook, with_kwargs=True))
        self._hooks.append(self._model.register_forward_hook(self._loss_hook))
        for name, m in self._model.named_modules():
            if _LAYER.fullmatch(name):
                self._hooks.append(m.register_forward_hook(self._output_hook("out/" + name)))

    def end(self, rec, step, write=True):
        """Writes the capture (unless the step raised: `write` False) and
        annotates the bundle; returns True when it did."""
        if self._done:
            return False
        for h in self._hooks:
            h.remove()
        self._hooks, self._done = [], True
        if not write:
            return False
        why = None
        if self._forwards != 1:
            why = f"the model's forward ran {self._forwards} times in step {step}; the replay rebuilds one"
        elif not any(k.startswith("grad/") for k in self._tensors):
            why = f"no backward reached the model's parameters in step {step}"
        if why is not None:
            warnings.warn(f"{self._path} not written: {why}", UserWarning, stacklevel=4)
            rec.annotate("hf_model_unwritten", json.dumps(why))  # what replay --ranks says instead
            return False
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        write_safetensors(self._path, self._tensors, {"step": str(step), "objective": OBJECTIVE})
        rec.annotate("hf_model", json.dumps({"file": self._file, "step": step, "objective": OBJECTIVE,
                                             "logits_dtype": self._logits_dtype,
                                             "config": self._config}))
        self._tensors = {}
        return True

    def _grad_hook(self, hf, family, offset):
        """Sums the parameter's gradients under its HF names (a fused
        experts gradient split as the parameter is)."""
        def hook(grad):
            with torch.no_grad(), _untraced():
                for name, g in split_fused(hf, grad, family, offset):
                    key = "grad/" + name
                    got = self._tensors.get(key)
                    self._tensors[key] = g.detach().clone() if got is None else got + g
        return hook

    def _input_hook(self, module, args, kwargs):
        self._forwards += 1
        if self._forwards == 1:
            ids = args[0] if args else kwargs.get("input_ids")
            if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
                raise ValueError("moerr.record(model=...): the model's first argument (or input_ids=) must be the "
                                 "input ids [B, S] "
                                 f"int64, not {getattr(ids, 'dtype', type(ids).__name__)}")
            with _untraced():
                self._tensors["batch/input_ids"] = ids.detach().clone()

    def _output_hook(self, key):
        def hook(module, args, output):
            if self._forwards == 1:
                out = output[0] if isinstance(output, tuple) else output
                with _untraced():
                    self._tensors[key] = out.detach().float().clone()
        return hook

    def _loss_hook(self, module, args, output):
        if self._forwards != 1:
            return
        logits = output[0] if isinstance(output, tuple) else getattr(output, "logits", output)
        ids = self._tensors["batch/input_ids"]
        with torch.no_grad(), _untraced():
            self._logits_dtype = str(logits.dtype).replace("torch.", "")
            logits = logits.detach().float()
            self._tensors["out/logits"] = logits.clone()
            self._tensors["out/loss"] = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _untraced():
    """The capture's own copies are no ops of the step: the recorder records
    nothing inside this scope (recorder/op_tracer.h)."""
    return torch.autograd.profiler.record_function("generate")
