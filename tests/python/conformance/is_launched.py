"""Conformance worker (imports torch): writes torch.distributed.is_torchelastic_launched() to
--out_file, for the is_torchelastic_launched scenario of torch's launcher tests."""
import argparse

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out_file", "--out-file", required=True)
args = parser.parse_args()
with open(args.out_file, "w") as out:
    out.write(f"{dist.is_torchelastic_launched()}")
