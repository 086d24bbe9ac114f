"""PyTorch's own tool on the same failing step: a Python port of the
reference model's training forward and GRPO loss (Qwen3-MoE layout, fp32 or
fp16 emulation, as moe/ computes them), run on the weights and batch that
export_step wrote, once plainly and once under torch.autograd.detect_anomaly.

    detect_anomaly.py STEP_DIR

Prints one JSON object: the backward function detect_anomaly names, the line
of the forward pass it blames, and the seconds of the step with and without
anomaly mode."""
import json
import math
import os
import struct
import sys
import time
import warnings

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


class Fp16Round(torch.autograd.Function):
    """moe::Boundary under fp16 emulation: round forward, round the gradient backward."""

    @staticmethod
    def forward(ctx, x, saturate):
        ctx.saturate = saturate
        return round_fp16(x, saturate)

    @staticmethod
    def backward(ctx, g):
        return round_fp16(g, ctx.saturate), None


def round_fp16(x, saturate):
    if saturate:
        x = x.clamp(-65504.0, 65504.0)
    return x.half().to(x.dtype)


class Port:
    def __init__(self, config, weights):
        self.c = config
        self.w = weights
        grpo = config["moerr_grpo"]
        if grpo["precision"] not in ("fp32", "fp16-emu") or config["model_type"] != "qwen3_moe":
            raise SystemExit("the port covers qwen3_moe in fp32 or fp16-emu")
        self.fp16 = grpo["precision"] == "fp16-emu"
        self.saturate = grpo["fp16_saturate"]
        self.aux = []

    def boundary(self, x):
        if not self.fp16:
            return x
        return Fp16Round.apply(x, self.saturate) if x.requires_grad else round_fp16(x, self.saturate)

    def rmsnorm(self, x, name):
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"])
        return self.boundary((self.w[name] * normed).to(x.dtype))

    def rotary(self, x):
        seq, dim = x.shape[2], x.shape[3]
        half = dim // 2
        inv_freq = 1.0 / torch.pow(self.c["rope_theta"], torch.arange(0, half, dtype=torch.float32) * 2.0 / dim)
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], -1)
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * emb.cos() + rotated * emb.sin()

    def attention(self, x, p):
        b, s = x.shape[0], x.shape[1]
        h, kv, d = self.c["num_attention_heads"], self.c["num_key_value_heads"], self.c["head_dim"]
        q = self.boundary(F.linear(x, self.w[p + "q_proj.weight"])).view(b, s, h, d).transpose(1, 2)
        k = self.boundary(F.linear(x, self.w[p + "k_proj.weight"])).view(b, s, kv, d).transpose(1, 2)
        v = self.boundary(F.linear(x, self.w[p + "v_proj.weight"])).view(b, s, kv, d).transpose(1, 2)
        q = self.rotary(self.rmsnorm(q, p + "q_norm.weight"))
        k = self.rotary(self.rmsnorm(k, p + "k_norm.weight"))
        k = k.repeat_interleave(h // kv, 1)
        v = v.repeat_interleave(h // kv, 1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = self.boundary(scores).masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores.float(), -1).to(v.dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, s, h * d)
        return self.boundary(F.linear(self.boundary(out), self.w[p + "o_proj.weight"]))

    def expert(self, x, p):
        act = self.boundary(F.silu(self.boundary(F.linear(x, self.w[p + "gate_proj.weight"])))
                            * self.boundary(F.linear(x, self.w[p + "up_proj.weight"])))
        return self.boundary(F.linear(act, self.w[p + "down_proj.weight"]))

    def moe(self, x, p):
        hidden, k, n = x.shape[-1], self.c["num_experts_per_tok"], self.c["num_experts"]
        flat = x.reshape(-1, hidden)
        logits = F.linear(flat.float(), self.w[p + "gate.weight"].float())
        scores = torch.softmax(logits, -1)
        ids = scores.topk(k, -1)[1]
        weights = scores.gather(1, ids)
        if self.c["norm_topk_prob"]:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(flat)
        for e in range(n):
            token, slot = (ids == e).nonzero(as_tuple=True)
            if len(token):
                y = self.expert(flat[token], p + "experts.%d." % e) * weights[token, slot].unsqueeze(1)
                out = out.index_add(0, token, y)
        share = torch.bincount(ids.reshape(-1), minlength=n).float() / (flat.shape[0] * k)
        self.aux.append(n * (share * scores.mean(0)).sum())
        return self.boundary(out.view(x.shape))

    def forward(self, tokens):
        self.aux = []
        dense = set(self.c.get("mlp_only_layers", []))
        h = self.boundary(self.w["model.embed_tokens.weight"][tokens])
        for layer in range(self.c["num_hidden_layers"]):
            p = "model.layers.%d." % layer
            h = h + self.attention(self.rmsnorm(h, p + "input_layernorm.weight"), p + "self_attn.")
            normed = self.rmsnorm(h, p + "post_attention_layernorm.weight")
            mlp = self.expert(normed, p + "mlp.") if layer in dense else self.moe(normed, p + "mlp.")
            h = self.boundary(h + mlp)
        h = self.rmsnorm(h, "model.norm.weight")
        head = self.w["model.embed_tokens.weight" if self.c["tie_word_embeddings"] else "lm_head.weight"]
        return self.boundary(F.linear(h, head)).float()

    def step(self, batch):
        """The training forward, GRPO loss and loss-scaled backward of GrpoTrainer::Step."""
        grpo = self.c["moerr_grpo"]
        prompts, responses = batch["prompts"], batch["responses"]
        inputs = torch.cat([prompts, responses], 1)[:, :-1]
        p, a = prompts.shape[1], responses.shape[1]
        predicting = self.forward(inputs)[:, p - 1:p - 1 + a]
        if grpo["naive_fp16_softmax"]:
            e = round_fp16(predicting.exp(), False)
            logp_all = (e / e.sum(-1, keepdim=True)).log()
        else:
            logp_all = torch.log_softmax(predicting, -1)
        logp = logp_all.gather(2, responses.unsqueeze(-1)).squeeze(-1).float()
        ratio = torch.exp(logp - batch["old_logp"])
        clipped = ratio.clamp(1 - grpo["clip_eps"], 1 + grpo["clip_eps"])
        adv = batch["advantages"]
        surrogate = torch.minimum(ratio * adv, clipped * adv)
        log_ref_ratio = batch["ref_logp"] - logp
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1
        tokens = batch["mask"].sum().clamp_min(1)
        loss = ((-surrogate + grpo["kl_coef"] * kl) * batch["mask"]).sum() / tokens
        loss = loss + grpo["aux_loss_coef"] * sum(self.aux)
        (loss * self.c["moerr_loss_scale"]).backward()
        return loss


def main():
    torch.set_num_threads(1)
    step_dir = sys.argv[1]
    with open(os.path.join(step_dir, "config.json")) as f:
        config = json.load(f)
    tensors = load_safetensors(os.path.join(step_dir, "model.safetensors"))
    batch = {k[len("batch."):]: v for k, v in tensors.items() if k.startswith("batch.")}

    def fresh_port():
        weights = {k: v.clone().requires_grad_(v.is_floating_point())
                   for k, v in tensors.items() if not k.startswith("batch.")}
        return Port(config, weights)

    start = time.perf_counter()
    loss = fresh_port().step(batch)
    plain = time.perf_counter() - start

    named, blamed, error = None, None, None
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                fresh_port().step(batch)
        except RuntimeError as e:
            error = str(e).splitlines()[0]
            named = error.split("'")[1] if "'" in error else error
    anomaly = time.perf_counter() - start
    for w in caught:
        text = str(w.message)
        if "Traceback of forward call" in text:
            # The innermost frame of this file: the port's line that built the node.
            frames = [line.strip() for line in text.splitlines() if line.strip()]
            for i, line in enumerate(frames):
                if line.startswith("File") and __file__.split("/")[-1] in line and i + 1 < len(frames):
                    blamed = "%s: %s" % (line.split(", in ")[-1], frames[i + 1])
    print(json.dumps({"loss": float(loss), "named": named, "forward_line": blamed, "error": error,
                      "seconds_plain": plain, "seconds_anomaly": anomaly}))


if __name__ == "__main__":
    main()
