"""Predictive Pipelined Decoding (Yang et al.; package ppd_pipelined, not prompt_decoding): theory, decoder, heads, match rates."""
