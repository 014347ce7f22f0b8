"""What a run reads: the model registry (loading, conversion, tiny random models), the datasets
(embedded and hub) and prompt formatting (chat templates, truncation). Imports the engine and base."""
