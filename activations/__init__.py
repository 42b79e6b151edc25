"""One registry of MLP/FFN activations, shared by every model in nanoact.

    from activations import build, available
    act = build("aglu", kappa_init=(0.8, 1.2))

See activations/README.md for each formula and its options. Parametric modules (AGLU, APA,
NSwish, NReLU, xATLU/xGELU/xSiLU, PolyReLU/PolyNorm) also have `telemetry() -> dict[str, float]` (learned
values, running statistics) for logging at evaluation time. A training loop calls `step_statistics(model)` once per
optimizer step, after its backward passes: NSwish/NReLU update their running statistics there, from the whole
step's batch.

An MLP/FFN `act` setting also names the MLP's form: a registry name is the plain MLP, down(act(x W)); a gated
(GLU) name, `NAME_glu` for any registered NAME or Shazeer's swiglu / geglu / reglu, is down(act(x W_gate) * (x W_up))
with NAME on the gate (activations/gated.py). `mlp_activation(setting)` splits a setting into the two.
"""
import importlib
import inspect

from activations.aglu import AGLU, APA
from activations.anact import NReLU, NSwish, micro_batch_note, step_statistics  # noqa: F401 (the package's API)
from activations.basic import GELU, GELUExact, LeakyReLU2, Mish, ReLU, ReLU2, SiLU
from activations.expanded import XATLU, XGELU, XSiLU
from activations.impl import loaded_kernels
from activations.polycom import PolyNorm, PolyReLU
from errors import ConfigError

_REGISTRY = {
    "gelu": GELU,
    "gelu_exact": GELUExact,
    "relu": ReLU,
    "relu2": ReLU2,
    "leaky_relu2": LeakyReLU2,
    "silu": SiLU,
    "swish": SiLU,
    "aglu": AGLU,
    "apa": APA,
    "nswish": NSwish,
    "nrelu": NReLU,
    "mish": Mish,
    "xatlu": XATLU,
    "xgelu": XGELU,
    "xsilu": XSiLU,
    "polyrelu": PolyReLU,
    "polynorm": PolyNorm,
}

# ANAct's "NSwish + k Swish": the unnormalized activation kept in the top k layers.
_PLAIN = {"nswish": "silu", "nrelu": "relu"}

# Gated MLP names: NAME_glu for every registered NAME, and the three of Shazeer 2020, "GLU Variants Improve
# Transformer" (GeGLU there is the gate's GELU; ours is GPT-2's tanh one, gelu_exact_glu the erf one).
GLU_SUFFIX = "_glu"
GLU_NAMES = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


def register(name, cls):
    _REGISTRY[name] = cls
    return cls


def available():
    return sorted(_REGISTRY)


def plain_name(name):
    """The unnormalized counterpart of `name` (nswish -> silu, nrelu -> relu); other names map to themselves."""
    return _PLAIN.get(name, name)


def layer_activation(name, options, layer, n_layers, plain_top_k=0):
    """The activation of layer `layer` (0 = bottom) of `n_layers`: ANAct's "NSwish + k Swish" gives the
    top `plain_top_k` layers the unnormalized counterpart, which takes none of the normalized one's
    options (per_instance, momentum ...). The one place this rule lives; every model calls it."""
    if not 0 <= plain_top_k <= n_layers:
        raise ConfigError(f"plain_top_k={plain_top_k} must lie in [0, {n_layers}] (the number of layers)")
    if layer >= n_layers - plain_top_k and plain_name(name) != name:
        return build(plain_name(name))
    return build(name, **options)


def gate_activation(setting):
    """The gate's activation of a gated MLP setting (swiglu -> silu, aglu_glu -> aglu); None for any other."""
    if setting in GLU_NAMES:
        return GLU_NAMES[setting]
    base = setting[:-len(GLU_SUFFIX)] if setting.endswith(GLU_SUFFIX) else None
    return base if base in _REGISTRY else None


def mlp_activation(setting):
    """An MLP/FFN `act` setting -> (the registry name of its activation, gated?): "aglu" -> ("aglu", False),
    "swiglu" -> ("silu", True), "aglu_glu" -> ("aglu", True). An unknown setting raises ValueError."""
    gate = gate_activation(setting)
    if gate is not None:
        return gate, True
    activation_class(setting)
    return setting, False


def activation_class(name):
    """The class registered as `name`; an unknown name raises ValueError with the choices."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown activation {name!r}; choose one of: {', '.join(available())} (a gated MLP: "
                          f"{', '.join(GLU_NAMES)} or NAME{GLU_SUFFIX} for any of these)")
    return _REGISTRY[name]


def build(name, **kwargs):
    """Instantiate activation `name`; unknown names and bad kwargs raise ValueError with the choices."""
    cls = activation_class(name)
    params = inspect.signature(cls.__init__).parameters
    # Skip self and nn.Module.__init__'s *args/**kwargs (the fixed activations have no options).
    valid = [n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    bad = [k for k in kwargs if k not in valid]
    if bad:
        choices = ", ".join(valid) if valid else "none"
        raise ConfigError(f"activation {name!r} takes no option(s) {', '.join(bad)}; its options: {choices}")
    return cls(**kwargs)


_FUSED_MLP = []


def load_fused_mlp():
    """activations/fused_mlp.py, imported at its first use: Triton is imported only where a run chose the fused MLP
    (policy.py sets mlp.fused); None without Triton."""
    if not _FUSED_MLP:
        _FUSED_MLP.append(importlib.import_module("activations.fused_mlp") if loaded_kernels() is not None else None)
    return _FUSED_MLP[0]
