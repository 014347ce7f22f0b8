"""Predictive Pipelined Decoding (PPD): theory (Section 4) and, later, the decoder."""
