"""A small real training run for checking gpuwatch on a GPU box (tests/device/run.sh).

An MLP autoencoder on random data in bf16 autocast: enough matmul to keep an H100 busy, a
loss that goes down, TensorBoard scalars through torch's own SummaryWriter, a checkpoint
folder every --ckpt-every steps (written to a .tmp name, then renamed), and a log line every
10 steps. --resume DIR continues from a checkpoint folder, as `gpuwatch relaunch` fills it in.
"""

import argparse
import os
import time

import torch
from torch.utils.tensorboard import SummaryWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume")
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--ckpt-every", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = 0
    if args.resume:
        state = torch.load(os.path.join(args.resume, "state.pt"), map_location="cuda")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        print(f"resumed from {args.resume} at step {step}", flush=True)
    writer = SummaryWriter("runs")
    basis = torch.randn(64, 4096, device="cuda")
    started = time.time()
    while step < args.steps:
        x = torch.randn(8192, 64, device="cuda") @ basis  # low-rank data: learnable
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0:
            value = loss.item()
            writer.add_scalar("train/loss", value, step)
            print(f"step {step} loss {value:.5f} {time.time() - started:.1f}s", flush=True)
        if step % args.ckpt_every == 0:
            final = f"outputs/checkpoint-{step}"
            tmp = final + ".tmp"
            os.makedirs(tmp, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(tmp, "state.pt"))
            os.rename(tmp, final)
            writer.flush()


if __name__ == "__main__":
    main()
