# The condition of `if` is a number known when the model is built.
model m {
  config { d = 4 }
  input x : [2, d]
  param w : [d, d]
  h = matmul(x, w)
  if h {
    h = h * 2
  }
  if gelu {
    h = h * 3
  }
  loss = sum(sum(h, 0), 0)
}
