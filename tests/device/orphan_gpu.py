"""A launcher that dies and leaves its rank holding VRAM (U11), for tests/device/run.sh.

The parent starts a child that allocates --gib GiB on the GPU and then sleeps (doing no work),
waits until the child says it holds the memory, and exits without stopping it: the child is
re-parented, not a session leader, its GPU idle: what gpuwatch calls an orphaned VRAM zombie.
"""

import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "rank":
    import torch

    held = torch.empty(int(float(sys.argv[2]) * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    print("rank holds", held.numel() >> 20, "MiB", flush=True)
    time.sleep(3600)
else:
    gib = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--gib" else "8"
    rank = subprocess.Popen([sys.executable, __file__, "rank", gib], stdout=subprocess.PIPE)
    print(rank.stdout.readline().decode().strip(), "; launcher exits", flush=True)
    sys.exit(1)
