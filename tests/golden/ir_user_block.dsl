# A user-defined block with a shape pattern, named arguments, a function
# argument and sharding intents of its own; shadows nothing.
block gated(x : [b, t, d], hidden, act = silu, scale = 1.0) {
  param up : [d, hidden] init normal(0.01) shard column
  param down : [hidden, d] init zeros shard row
  h = act(matmul(x, up))
  return matmul(h, down) * scale
}
model custom {
  config { seq = 4  d = 8 }
  input x0 : f32[batch, seq, d]
  input targets : i32[batch, seq]
  y = x0 + gated(x0, 2 * d, act = relu, scale = 0.5) as g1
  y = y + gated(y, 16) as g2
  loss = cross_entropy(y, targets)
}
train { batch = 3  optimizer = sgd(momentum = 0.9)  clip = 0.0  seed = 7 }
