"""Training infrastructure: the one training loop, the trainers' shared CLI, the sharded corpus
of the model's own answers and the labels made from it (teacher-forced passes, sequence
corpora). Imports assets, engine and base; names no trained component."""
