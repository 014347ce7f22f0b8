"""Hardware-aware Parallel Prompt Decoding (Chen et al., 2024): trained prompt tokens guess future
tokens inside the verification forward; a dynamic sparse tree sized to the hardware."""
