"""The optimizer of both trainers."""
import torch


def adamw(model, lr, weight_decay, betas, eps, device_type):
    """AdamW that decays only >=2-D weights (matrices, embeddings): biases, norms and an activation's own scalars
    (AGLU's kappa/lam, NSwish's and xSiLU's alpha, PolyCom's coefficients) never decay. Fused on CUDA: one kernel
    for all parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device_type == "cuda")
