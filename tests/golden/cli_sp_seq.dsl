# ARGS: --tp 4 --sp -o parc-out-not-written
# Sequence parallelism needs the sequence to split evenly over tp.
model m {
  config { vocab = 32  seq = 6  d = 8 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte
  logits = lm_head(rmsnorm(x) as norm, vocab) as head
  loss = cross_entropy(logits, targets)
}

train { batch = 4  microbatches = 1  steps = 1  lr = 1e-3  optimizer = sgd(momentum = 0.9) }
