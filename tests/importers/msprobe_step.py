"""One training step of a tiny Hugging Face Qwen2-MoE model (forward,
causal-LM loss, backward, AdamW), dumped by msprobe's own PrecisionDebugger.
Layer 1's expert 2 has its down projection scaled by 1e37 (fp32), so its
output reaches about 1e34 and the first non-finite value appears later, in a
norm, as an RMSNorm's pow; the loss stays finite. With --proj gate_up_proj
--scale 1e20 the product of its activation and up projection overflows at
once, and the loss and every gradient are NaN. With --world 2, two gloo ranks run it data parallel (each
its own batch, then an all_reduce of every gradient) and only the last
rank's expert is scaled.

    python msprobe_step.py TASK LEVEL DUMP_PATH [--summary md5] [--world 2]
                           [--experts grouped_mm] [--proj gate_up_proj] [--scale 1e20]
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

LAYER, EXPERT = 1, 2


def tiny_qwen2_moe(experts="eager"):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    config = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            shared_expert_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                            tie_word_embeddings=False)
    # "eager": a loop of F.linear per expert, which msprobe dumps;
    # "grouped_mm" (transformers' default on the CPU): a grouped matmul it does not.
    config._experts_implementation = experts
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(config).float()


def step(rank, args):
    world = args.world
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + args.dump_path + ".rdzv", rank=rank,
                                world_size=world)
    from msprobe.pytorch import PrecisionDebugger
    model = tiny_qwen2_moe(args.experts)
    if rank == world - 1:
        with torch.no_grad():
            getattr(model.model.layers[LAYER].mlp.experts, args.proj)[EXPERT].mul_(args.scale)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    task_config = {"scope": [], "list": [], "data_mode": ["all"]}
    if args.summary:
        task_config["summary_mode"] = args.summary
    config = {"task": args.task, "dump_path": args.dump_path, "rank": [], "step": [], "level": args.level,
              args.task: task_config}
    config_path = f"{args.dump_path}.rank{rank}.json"
    with open(config_path, "w") as f:
        json.dump(config, f)
    debugger = PrecisionDebugger(config_path=config_path)
    torch.manual_seed(100 + rank)
    ids = torch.randint(0, 64, (2, 8))
    debugger.start(model)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if world > 1:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
    opt.step()
    debugger.stop()
    debugger.step()
    print(f"rank {rank}: loss {loss.item()}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("level")
    parser.add_argument("dump_path")
    parser.add_argument("--summary")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--experts", default="eager", choices=["eager", "grouped_mm"])
    parser.add_argument("--proj", default="down_proj", choices=["down_proj", "gate_up_proj"])
    parser.add_argument("--scale", type=float, default=1e37)
    args = parser.parse_args()
    if args.world == 1:
        step(0, args)
        return
    if os.path.exists(args.dump_path + ".rdzv"):
        os.remove(args.dump_path + ".rdzv")
    torch.multiprocessing.spawn(step, args=(args,), nprocs=args.world)


if __name__ == "__main__":
    main()
