"""The optimizer of both trainers."""
import torch


def adamw(model, lr, weight_decay, betas, eps, device_type, groups=None):
    """AdamW that decays only >=2-D weights (matrices, embeddings): biases, norms and an activation's own scalars
    (AGLU's kappa/lam, NSwish's and xSiLU's alpha, PolyCom's coefficients) never decay. groups: the model's own
    parameter groups instead (model_parts/parametrization.py's under muP and CompleteP), each with its weight decay,
    eps and lr_scale. Fused on CUDA: one kernel for all parameters."""
    if groups is None:
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device_type == "cuda")


def set_lr(optimizer, lr):
    """The schedule's lr into every group, times the group's lr_scale (a parametrization's; 1 when it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
