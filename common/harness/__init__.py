"""The benchmark harness: benchmarks and cost curves (raw JSONL records), reports, notebook
rendering and execution, the summary, Spec-Bench's format, stand-in references. The top layer."""
