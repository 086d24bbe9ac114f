"""moerr for PyTorch training loops: record steps into a bundle the moerr
command inspects, replays, bisects and diffs.

    import moerr
    moerr.instrument(model)                      # module paths in the trace
    with moerr.record("run.moerr", mode="replayable") as rec:
        for step in range(n):
            with rec.step():
                loss = model(batch).loss
                loss.backward()
                with moerr.scope("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                rec.outcome(loss=loss.item())

Routers in HF's MoE layout (a `gate` Linear next to an `experts`
ModuleList, with `top_k`; or transformers 5's router modules, which return
logits, top-k weights and ids) report their decisions by themselves once
instrumented; others call `moerr.routing(...)`. `moerr.Bundle(path)` reads a
bundle back. Inside a torch.distributed loop, `moerr.record(RUN)` writes one
bundle per rank and RUN/world.json and records the collectives
(docs/DISTRIBUTED.md, "Python"). Errors from the C++ side are ValueError (bad input),
FileNotFoundError or RuntimeError, carrying moerr's message; misuse of the
recording API (`rec.step()` without `with`, nested recordings, an existing
path without overwrite=True) raises RuntimeError or FileExistsError at once.
A recording that holds less than it seems to (a step with no ops, a bundle
with no complete step) warns with RecordingWarning.
"""
import contextlib
import json
import math
import os
import re
import traceback
import warnings

import torch
import torch.distributed

from ._moerr import Bundle as _Bundle
from ._moerr import Recorder as _Recorder
from ._version import __version__

__all__ = ["record", "instrument", "routing", "scope", "Bundle", "RecordingWarning"]

_active = None  # the Recording in progress, if any

_STEP_FORM = """rec.step() is a context manager; called on its own it records nothing. Write:
    with rec.step():
        ...  # forward, backward, optimizer step
        rec.outcome(loss=loss.item())"""


class RecordingWarning(UserWarning):
    """A recording holds less than it seems to: a step that recorded no ops,
    or a bundle closed with no complete step."""


class _Step:
    """What `Recording.step` returns: entering it begins the step, leaving
    it ends the step."""

    def __init__(self, recording, index):
        self._recording = recording
        self._index = index

    def __enter__(self):
        return self._recording._begin(self)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._recording._end(warn=True)
        else:
            self._recording._raised(exc_type, exc, tb)
        return False  # the exception propagates unchanged


class Recording:
    """A recording in progress; `record` makes one."""

    def __init__(self, recorder, path, window, hf=None):
        self._rec = recorder
        self._hf = hf  # the model's capture (_hf.Capture), when record was given one
        self._path = str(path)
        self._window = window  # (first, last): the steps recorded
        self._step = -1
        self._outcome = {}
        self._in_step = False
        self._ops_at_begin = 0
        self._pending = None  # a _Step made but not entered

    def step(self, index=None):
        """Use as `with rec.step():`; the body is one training step
        (numbered from 0 unless given). Steps do not nest. Called on its own,
        without `with`, it records nothing, and the next call into the
        recording (or its close) raises RuntimeError. A step in which no op
        ran warns with RecordingWarning (it is written, with no ops)."""
        self._check_entered()
        if self._in_step:
            raise RuntimeError(f"rec.step() inside step {self._step}: steps do not nest")
        self._pending = _Step(self, index)
        return self._pending

    def _check_entered(self):
        if self._pending is not None:
            self._pending = None
            raise RuntimeError(_STEP_FORM)

    def _begin(self, step):
        if step is not self._pending:
            raise RuntimeError("enter each rec.step() once, right where it is made: " + _STEP_FORM)
        self._pending = None
        if self._in_step:
            raise RuntimeError(f"rec.step() inside step {self._step}: steps do not nest")
        self._step = self._step + 1 if step._index is None else step._index
        self._outcome = {}
        self._rec.step_begin(self._step)
        self._ops_at_begin = self._rec.ops_recorded()
        self._in_step = True
        if self._hf is not None and self._window[0] <= self._step <= self._window[1]:
            self._hf.begin()
        return self._step

    def _end(self, warn):
        self._in_step = False
        metrics = self._outcome
        self._rec.step_end(self._step, metrics.get("loss", 0.0), metrics.get("grad_norm", 0.0), list(metrics.items()))
        first, last = self._window
        if self._hf is not None and first <= self._step <= last:
            self._hf.end(self._rec, self._step, write=warn)
        if warn and first <= self._step <= last and self._rec.ops_recorded() == self._ops_at_begin:
            warnings.warn(f"{self._path}: step {self._step} recorded no ops: run the model's forward and backward "
                          "inside `with rec.step():`", RecordingWarning, stacklevel=3)

    def _raised(self, exc_type, exc, tb):
        """The step was left by an exception: recorded as raised (its type,
        message and traceback, and the last op seen), not as complete. A
        failure to record it warns; the loop's exception is what propagates."""
        self._in_step = False
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        try:
            self._rec.step_raised(self._step, exc_type.__qualname__, str(exc), text)
        except Exception as e:  # noqa: BLE001 - never hide the loop's own exception
            warnings.warn(f"{self._path}: step {self._step} raised {exc_type.__qualname__}, and recording it "
                          f"failed: {e}", RecordingWarning, stacklevel=3)
        first, last = self._window
        if self._hf is not None and first <= self._step <= last:
            self._hf.end(self._rec, self._step, write=False)

    def outcome(self, loss=None, grad_norm=None, **metrics):
        """The step's named float metrics: loss, grad_norm and any others of the
        loop (reward=, kl=, entropy=, clip_fraction=, response_length=, ...).
        They are written with the step (the annotation "outcome", shown by
        `moerr inspect` and `moerr report`); the anomaly trigger judges the
        loss and grad norm, and the metrics named in record(watch=). Inside a
        step only; a later call in the same step adds to or replaces them."""
        self._check_entered()
        if not self._in_step:
            raise RuntimeError("rec.outcome() outside a step: call it inside `with rec.step():`")
        given = dict(metrics)
        if loss is not None:
            given["loss"] = loss
        if grad_norm is not None:
            given["grad_norm"] = grad_norm
        for name, value in given.items():
            try:
                self._outcome[name] = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"rec.outcome({name}=...): a metric is a float, got {type(value).__name__}") from None

    def annotate(self, key, value, step=False):
        """A JSON-serialisable annotation, of the bundle or (step=True, inside
        a step only) of the current step."""
        self._check_entered()
        if step and not self._in_step:
            raise RuntimeError("rec.annotate(..., step=True) outside a step: call it inside `with rec.step():`")
        text = json.dumps(value)
        (self._rec.annotate_step if step else self._rec.annotate)(key, text)

    def name_parameters(self, model, prefix=""):
        """Stores the model's parameters under their names (param/NAME@id)."""
        self._rec.name_tensors([(prefix + n, p) for n, p in model.named_parameters()])

    @property
    def written_steps(self):
        return list(self._rec.written_steps())


@contextlib.contextmanager
def record(path, mode="replayable", trigger="always", steps=None, ring=2, spike=10.0, overwrite=False,
           ep_size=None, experts=None, model=None, hf_config=None, watch=None):
    """Records the steps run inside into the bundle `path`.

    mode: "stats", "replayable" or "full". trigger: "always", "window"
    (steps=(first, last)) or "anomaly" (keeps the last `ring` steps in files
    beside the bundle, `path`.ring, which a killed process leaves for `moerr
    salvage`; writes them into the bundle at a step's first non-finite value
    from finite inputs, when a step's loss or grad norm goes non-finite or
    the grad norm exceeds `spike` times its median, or when a step raises).

    watch: with trigger="anomaly", rules on the metrics the loop passes to
    rec.outcome(), by name: "spike" (the value past `spike` times the median
    of its magnitude over the steps before), "collapse" (below half its
    median), or a pair with the threshold, ("collapse", 0.2). A watched
    metric that goes non-finite is anomalous too; each rule starts judging
    at the metric's 4th value. watch={"kl": "spike", "reward": "collapse"}.

    A step whose body raises is recorded as raised, not complete: the
    exception's type, message and traceback and the last op recorded,
    which `moerr inspect`, `report`, `bisect` and `replay` show first. The
    exception propagates unchanged.

    With torch.distributed initialised, `path` is the run directory: every
    rank enters `record` together, rank K writes `path`/rank<K>.moerr and
    rank 0 writes `path`/world.json, naming every process group (the default
    one "world", others "ranks:" and their world ranks) and, given `ep_size`
    and `experts` (per MoE layer), the expert-parallel layout (EP groups of
    ep_size consecutive ranks, rank r hosting experts [r*X/E, (r+1)*X/E)).
    Inside, torch.distributed's all_reduce, all_to_all_single, all_gather,
    all_gather_into_tensor, reduce_scatter(_tensor) and broadcast are
    recorded as collectives of the trace (called as `dist.all_reduce(...)`;
    a name imported before `record` is not seen); async_op=True is waited
    on at once.

    `model` and `hf_config` (config.json's keys, a dict) make the run one
    `moerr replay RUN --ranks M` rebuilds: at the first step recorded each
    rank writes what it holds of the model under HF names, the step's input
    ids, layer outputs, loss and gradients (python/moerr/_hf.py has the
    details; docs/DISTRIBUTED.md, "Python"). The model must be one of the
    families moerr rebuilds (qwen2_moe, qwen3_moe, mixtral, deepseek_v3) in
    HF's names (transformers 5's fused experts are split per expert), its
    forward take the input ids [B, S] as first argument (or input_ids=) and
    return the logits (or an output with .logits), the objective causal-LM next-token cross entropy; an
    expert-parallel block holding experts [o, o + L) of the layer sets
    `expert_offset = o`. A model outside the families raises ValueError
    naming the offending parameters. Needs torch.distributed; not with
    trigger="anomaly".

    An existing `path` (with torch.distributed, an existing bundle of this
    rank or world.json) raises FileExistsError unless overwrite=True. One
    recording at a time: a `record` inside another raises RuntimeError.
    Closing a bundle that holds no complete step (no `with rec.step():`
    ran, none inside the window, or, with trigger="anomaly", no step was
    anomalous) warns with RecordingWarning."""
    global _active
    if _active is not None:
        raise RuntimeError(f"moerr.record({str(path)!r}) inside moerr.record({_active._path!r}): "
                           "one recording at a time; close the first")
    collectives = None
    hf = None
    if (model is None) != (hf_config is None):
        raise ValueError("model and hf_config go together: pass both, or neither")
    if model is not None:
        if not _distributed_active():
            raise ValueError("model= records for `moerr replay RUN --ranks M`: initialise torch.distributed first")
        if trigger == "anomaly":
            raise ValueError("model= captures the first step recorded; with trigger=\"anomaly\" it is not known")
        from . import _hf
        hf = _hf.Capture(model, hf_config, path, torch.distributed.get_rank())
    if _distributed_active():
        from . import _distributed
        path = _distributed.prepare_run(path, overwrite, ep_size, experts)
    elif ep_size is not None or experts is not None:
        raise ValueError("ep_size and experts describe a torch.distributed run: initialise torch.distributed first")
    elif not overwrite and os.path.lexists(path):
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    first, last = (0, 2**62) if steps is None else steps
    if steps is not None and trigger == "always":
        trigger = "window"
    rules = _watch_rules(watch, spike, trigger)
    rec = Recording(_Recorder(str(path), mode, trigger, first, last, ring, spike, overwrite, rules), path,
                    (first, last) if trigger == "window" else (-2**62, 2**62), hf)
    _active = rec
    if _distributed_active():
        collectives = _distributed.Collectives(rec._rec)
        collectives.install()
    try:
        yield rec
    finally:
        if collectives is not None:
            collectives.restore()
        _active = None
        rec._rec.stop()
    # Reached when the body raised nothing.
    rec._check_entered()
    if not rec.written_steps:
        why = {"always": "no `with rec.step():` ran inside the recording",
               "window": f"no step inside the window steps=({first}, {last}) ran",
               "anomaly": "no step was anomalous (trigger=\"anomaly\" writes steps only then)"}.get(trigger, "")
        warnings.warn(f"{path} holds no complete step: {why}", RecordingWarning, stacklevel=3)


def _watch_rules(watch, spike, trigger):
    """record(watch=) as (metric, rule, threshold) triples."""
    if not watch:
        return []
    if trigger != "anomaly":
        raise ValueError(f"watch= sets rules of the anomaly trigger; trigger is {trigger!r}, not \"anomaly\"")
    defaults = {"spike": float(spike), "collapse": 0.5}
    rules = []
    for metric, rule in dict(watch).items():
        kind, threshold = (rule, None) if isinstance(rule, str) else tuple(rule)
        if kind not in defaults:
            raise ValueError(f"watch[{metric!r}] = {rule!r}: the rule is \"spike\" or \"collapse\"")
        threshold = defaults[kind] if threshold is None else float(threshold)
        if not math.isfinite(threshold) or threshold <= 0:
            raise ValueError(f"watch[{metric!r}]: the threshold must be a positive number, got {threshold}")
        rules.append((str(metric), kind, threshold))
    return rules


def _distributed_active():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextlib.contextmanager
def scope(name):
    """Ops inside run in the user scope `name` ("optimizer" marks the optimizer
    phase; "generate" a rollout's sampling loop, which is not recorded: what it
    returns is a leaf of the step, part of the batch when first read inside
    scope("batch"))."""
    with torch.autograd.profiler.record_function(name):
        yield


def routing(layer, topk_ids, topk_weights, logits=None, hidden=None):
    """Reports one routing decision of MoE layer `layer`: topk_ids and
    topk_weights [T, k], logits [T, E] (optional: without them the expert
    count is what the ids show, and routing-fragility cannot judge the layer);
    `hidden` [T, d] the router's input.

    Outside a step (no recording, or between steps: an evaluation pass) it
    does nothing, as ops there are not recorded either, so a router may call
    it unconditionally; after `rec.step()` called without `with` it raises
    RuntimeError."""
    if _active is not None:
        _active._check_entered()
    if _active is None or not _active._in_step:
        return
    with torch.no_grad():
        h = hidden if hidden is not None else torch.empty(0)
        _active._rec.routing(int(layer), topk_ids.detach().long(), topk_weights.detach(),
                             None if logits is None else logits.detach().float(), h)


def _layer_index(name):
    m = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(m.group(1)) if m else 0


def instrument(model):
    """Pushes each module's qualified name as a scope around its forward, so
    the trace's module paths match `model.named_modules()`; makes HF-style
    MoE blocks (a `gate` Linear and an `experts` ModuleList, `top_k`; or a
    `gate` module returning (logits, top-k weights, top-k ids), as
    transformers 5's routers do, next to `experts`) report their routing.
    A local expert `experts.<j>` of an expert-parallel block that sets
    `expert_offset` is named by its global index, `experts.<expert_offset +
    j>`, as its parameters are in the bundle: expert 5 has one name on every
    rank. Returns the hook handles."""
    from moerr._hf import expert_offsets, global_name
    offsets = expert_offsets(model)
    handles = []
    for local_name, module in model.named_modules():
        if not local_name:
            continue
        name = global_name(local_name, offsets)[0]

        def pre(mod, args, name=name):
            # A scope left open: a forward stopped by an exception (as a
            # non-reentrant checkpoint stops its recomputation) skipped the
            # post hook. It ends here, before the module's new scope.
            _exit_scope(mod)
            mod._moerr_scope = torch.ops.profiler._record_function_enter_new(name, None)

        def post(mod, args, output):
            _exit_scope(mod)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
        gate = getattr(module, "gate", None)
        experts = getattr(module, "experts", None)
        if isinstance(gate, torch.nn.Linear) and isinstance(experts, torch.nn.ModuleList):
            handles.append(gate.register_forward_hook(_routing_hook(module, _layer_index(name))))
        elif isinstance(gate, torch.nn.Module) and isinstance(experts, torch.nn.Module):
            handles.append(gate.register_forward_hook(_router_output_hook(_layer_index(name))))
    return handles


def _exit_scope(module):
    handle = getattr(module, "_moerr_scope", None)
    if handle is not None:
        torch.ops.profiler._record_function_exit(handle)
        module._moerr_scope = None


def _routing_hook(block, layer):
    def hook(gate, args, logits):
        if _active is None or not _active._in_step:
            return
        with torch.no_grad():
            # An exact copy of what the observer would see is not needed: the
            # choice is recomputed the way HF's softmax top-k routers make it.
            probs = torch.softmax(logits.float(), dim=-1)
            weights, ids = torch.topk(probs, getattr(block, "top_k", 2), dim=-1)
            if getattr(block, "norm_topk_prob", False):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            hidden = args[0] if args else None
            routing(layer, ids.reshape(-1, ids.shape[-1]), weights.reshape(-1, ids.shape[-1]),
                    logits.reshape(-1, logits.shape[-1]),
                    None if hidden is None else hidden.reshape(-1, hidden.shape[-1]))
    return hook


def _router_output_hook(layer):
    """transformers 5's routers (Qwen2MoeTopKRouter, MixtralTopKRouter,
    DeepseekV3TopkRouter, ...) return (router_logits, top_k_weights,
    top_k_index): the decision is reported as the model made it. A gate
    whose output has another form reports nothing."""
    def hook(gate, args, output):
        if _active is None or not _active._in_step:
            return
        if not (isinstance(output, tuple) and len(output) == 3
                and all(isinstance(t, torch.Tensor) for t in output)):
            return
        logits, weights, ids = output
        if ids.is_floating_point() or ids.shape != weights.shape or ids.dim() < 1:
            return
        k = ids.shape[-1]
        hidden = args[0] if args and isinstance(args[0], torch.Tensor) else None
        routing(layer, ids.reshape(-1, k), weights.reshape(-1, k), logits.reshape(-1, logits.shape[-1]),
                None if hidden is None else hidden.reshape(-1, hidden.shape[-1]))
    return hook


class Bundle:
    """A bundle, read-only: steps (the complete ones), tensors (as torch
    tensors), ops (name, module, phase, their arguments as {"kind", "value"}
    and their outputs' fingerprints), routing decisions, annotations."""

    def __init__(self, path):
        self._b = _Bundle(str(path))

    @property
    def steps(self):
        return list(self._b.steps())

    def tensor(self, name, step=-1):
        return self._b.tensor(name, step)

    def tensor_names(self):
        return list(self._b.tensor_names())

    def ops(self, step):
        return self._b.ops(step)

    def tensor_meta(self, step, id):
        """Tensor `id` of `step`'s trace: dtype, shape, strides, offset,
        view_of (the id whose storage it views, 0: none), producer (the op
        that made it, -1: none) and leaf (its name in the bundle, or "")."""
        return self._b.tensor_meta(step, id)

    def routing(self, step):
        return self._b.routing(step)

    def annotation(self, key, step=-1):
        return json.loads(self._b.annotation(key, step))
