# Holds GIB GiB of GPU memory and fails on its first attempt (scripts/gpu-proof.sh): the restart
# waits until NVML no longer lists the failed worker on the GPU before the next one starts.
import os
import sys
import time

import torch


def main():
    gib = float(sys.argv[1])
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        time.sleep(1)
        sys.exit(3)
    print(f"restarted with {gib} GiB on the GPU", flush=True)


if __name__ == "__main__":
    main()
