# A row-parallel weight fed by a replicated value (no column weight first).
model bad_row {
  config { vocab = 32  seq = 4  d = 8 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte
  param w : [d, d] init normal(0.02) shard row
  logits = lm_head(matmul(x, w), vocab) as head
  loss = cross_entropy(logits, targets)
}

train { batch = 4  microbatches = 1  steps = 1  lr = 1e-3  optimizer = sgd(momentum = 0.9) }
