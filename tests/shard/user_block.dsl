# A user-defined block annotated like the prelude's (column, then row):
# sharded by propagation alone, one all_reduce per block under tp > 1.
block my_mlp(x, hidden) {
  param w_in : [dim(x, -1), hidden] init normal(0.02) shard column
  param b_in : [hidden] init zeros shard column
  param w_out : [dim(x, -1), hidden] init normal(0.02) shard row
  param b_out : [dim(x, -1)] init zeros shard row
  h = relu(matmul(x, w_in) + b_in) * exp(matmul(x, w_in))
  return matmul(h, w_out, transpose_b = 1) + b_out
}

model user_block {
  config { vocab = 32  seq = 4  d = 8  hidden = 16  layers = 2 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte
  repeat layers as h {
    x = x + my_mlp(rmsnorm(x) as norm, hidden) as mlp
  }
  logits = lm_head(rmsnorm(x) as norm_f, vocab) as head
  loss = cross_entropy(logits, targets)
}

train { batch = 4  microbatches = 1  steps = 1  lr = 1e-3  optimizer = sgd(momentum = 0.9) }
