# expert(d) names the dimension of each expert split over tp: dimension 0
# holds the experts themselves (split over ep), so expert(0) is refused.
model m {
  config { d = 8  seq = 4 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  param w : [4, 8, d] shard expert(0)
  x = embed(tokens, 16, d)
  loss = cross_entropy(lm_head(x, 16), targets)
}
train { batch = 2 }
