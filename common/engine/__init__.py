"""The engine: the target adapter (the one owner of a model's forwards and KV cache), the
layer-level forward with injected positions, the fast path, KV-cache edits, trees as data with
their masks, tree search and the acceptance rules. Imports only the base modules."""
