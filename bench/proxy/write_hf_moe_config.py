"""Writes DIR/config.json: a transformers Qwen3-MoE configuration with
moerr's `fine` preset's sizes (hidden 96, 4 layers, 6 heads of 16 with 2 kv
heads, 64 routed experts of width 24, top-8; Qwen3-MoE has no shared expert),
the top-k weights renormalised as Qwen3-30B-A3B's config.json has them
(norm_topk_prob, also moerr's presets'), the router's balancing loss at
fine's 0.01 and the addition task's 16-token vocabulary, for `moerr proxy-eval
--hf-config DIR/config.json` (bench/run_all.sh). Written by transformers'
own `Qwen3MoeConfig.save_pretrained`, so the file is what transformers
writes for the architecture, every default key included.

The balancing loss: at Qwen3-MoE's default (router_aux_loss_coef 0.001)
proxy-eval's 600-step warm-up leaves the model at 0.016 accuracy on the sums,
at 0.01 it reaches 0.750, the `fine` preset's (the same model: the config
then differs from the preset's only in max_position_embeddings).

    python bench/proxy/write_hf_moe_config.py DIR [--experts 64] [--top-k 8] [--router-aux-loss-coef 0.01]

Prints the path written."""
import argparse
import os
import sys

try:
    import transformers
except ImportError:  # bench/run_all.sh checks first; a direct run says what is missing
    sys.exit("write_hf_moe_config.py needs transformers (pip install transformers)")

TASK_VOCAB = 16  # moe::AdditionTask::kVocab: digits, +, =, EOS, BOS and two spare ids
FINE = dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
            intermediate_size=192, moe_intermediate_size=24)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="directory to write config.json into (created)")
    parser.add_argument("--experts", type=int, default=64, help="routed experts per MoE layer")
    parser.add_argument("--top-k", type=int, default=8, help="experts per token")
    parser.add_argument("--router-aux-loss-coef", type=float, default=0.01, help="the balancing loss's weight")
    args = parser.parse_args()
    config = transformers.Qwen3MoeConfig(vocab_size=TASK_VOCAB, num_experts=args.experts,
                                         num_experts_per_tok=args.top_k, norm_topk_prob=True,
                                         router_aux_loss_coef=args.router_aux_loss_coef,
                                         tie_word_embeddings=False, **FINE)
    os.makedirs(args.dir, exist_ok=True)
    config.save_pretrained(args.dir)
    print(os.path.join(args.dir, "config.json"))


if __name__ == "__main__":
    main()
