# A column-parallel output normalised whole: the partitioner replicates it
# (an all_gather whose gradient is the rank's piece of the whole one).
model gather {
  config { vocab = 32  seq = 4  d = 8 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte
  param w : [d, 2 * d] init normal(0.02) shard column
  y = rmsnorm(matmul(x, w)) as norm
  logits = lm_head(y, vocab) as head
  loss = cross_entropy(logits, targets)
}

train { batch = 4  microbatches = 1  steps = 1  lr = 1e-3  optimizer = sgd(momentum = 0.9) }
