"""Convert a GGUF checkpoint into the Hugging Face folder vLLM's CPU build loads.

Run by :mod:`herdless.launch.vllm` with the vLLM venv's interpreter (torch and
transformers live there, not in herdless's environment)::

    python _vllm_convert.py MODEL.gguf OUT_DIR

A plain ``save_pretrained`` after ``from_pretrained(gguf_file=...)`` fails here
(the weights stay packed), so the model is built from its config in bfloat16
and the GGUF tensors, dequantized, are loaded into it by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch  # type: ignore[import-not-found]
from transformers import (  # type: ignore[import-not-found]
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
)
from transformers.modeling_gguf_pytorch_utils import (  # type: ignore[import-not-found]
    load_gguf_checkpoint,
)


def convert(gguf: Path, out: Path) -> None:
    """Write safetensors, config and tokenizer for ``gguf`` into ``out``."""
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # The GGUF's quantization note would make vLLM look for packed weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    loaded = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.bfloat16
    )
    state = {k: v.to(torch.bfloat16) for k, v in loaded["tensors"].items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Only the output head is absent: it is tied to the embeddings.
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise SystemExit(f"unexpected tensors: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
