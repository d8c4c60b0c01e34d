"""Make GGUF files for `surogate bench gguf` where no hub is reachable (the lent GPU): a random
Llama of a given width as an HF folder (tiny offline tokenizer), quantized to Q8_0 and Q4_K_M.
    PYTHONPATH=tests python3 -P tests/sgtest/bench_gguf.py OUT_DIR [hidden layers]"""

import sys
from pathlib import Path

from sgtest.tiny_models import make_llama

from surogate.models.gguf_names import quantize_to_gguf

out = Path(sys.argv[1])
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 12
folder = make_llama(out / "hf", seed=0, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                    num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256), head_dim=64,
                    initializer_range=0.02)
for qtype in ("Q8_0", "Q4_K_M"):
    print(quantize_to_gguf(folder, out / f"llama-{hidden}x{layers}.{qtype}.gguf", qtype))
