# ARGS: --tp 4
# Each expert's hidden width (6) is split over tp by expert(1) / expert(2): --tp 4
# does not divide it.
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, 16, d)
  x = x + moe(x, 4, 2, 6) as moe
  loss = cross_entropy(lm_head(x, 16), targets)
}
train { batch = 2 }
