"""The device options of the benchmarks that time one model (bench/generation.py, bench/hellaswag.py)."""
import torch

from training.distributed import pick_device
from training.precision import autocast_for


def add_device_options(parser):
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--json", help="also write the numbers here")


def device_and_autocast(args):
    """(device string, autocast context) of the parsed options; sets torch's CPU threads if asked."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    return device, autocast_for(device.split(":")[0], args.dtype)
