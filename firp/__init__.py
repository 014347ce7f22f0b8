"""FIRP (Wu et al., 2024): linear maps predict future tokens' hidden states at intermediate layers;
the pseudo states run through the remaining layers inside the verification forward and become drafts."""
