"""verispec.runtime: the target/draft model behind the speculative engine.

    model = load_model()                        # embedded SmolLM2-135M-Instruct (GGUF)
    model.setup_cache(batch_size=2, max_seq_len=256)
    logits = model.prefill([ids_a, ids_b])      # [B, V]
    logits = model.append(draft_tokens)         # [B, k, V], lengths += k
    model.rollback(model.lengths - num_rejected)

See docs/runtime.md for the layout, the cache, CUDA graphs and what bounds decode speed.
"""
from .config import NAMED_SHAPES, ModelConfig, named_shape
from .hf_adapter import HFModel
from .loading import hf_state_dict, load_model
from .model import Model
from .tokenizer import Tokenizer

__all__ = ["load_model", "Model", "ModelConfig", "NAMED_SHAPES", "named_shape", "HFModel", "Tokenizer",
           "hf_state_dict"]
