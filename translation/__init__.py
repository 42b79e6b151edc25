"""The companion translation model of nanoact: DeepNorm encoder-decoder Transformer and its decoders."""
from translation.decode import beam_search, greedy, translate
from translation.model import Transformer, TranslationConfig, deepnorm_constants

__all__ = ["Transformer", "TranslationConfig", "deepnorm_constants", "greedy", "beam_search", "translate"]
