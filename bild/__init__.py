"""Big Little Decoder (Kim et al., 2023): a small model drafts, the large model falls back and rolls back."""
