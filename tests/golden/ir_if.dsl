# `if`: a body runs when its condition is not 0, in the enclosing scope; an
# off branch builds nothing, not even its parameters.
block scaled(x, by = 0, bias = 1) {
  if by {
    x = x * by
  }
  if bias {
    param b : [dim(x, -1)] init zeros
    x = x + b
  }
  return x
}

model m {
  config { d = 4  extra = 0 }
  input x : [2, d]
  param w : [d, d]
  h = scaled(matmul(x, w), by = 0.5, bias = 0) as s1
  h = scaled(h) as s2
  if extra {
    param never : [d]
    h = h + never
  }
  if extra - 1 {
    repeat 2 {
      h = h * 2.0
    }
  }
  loss = sum(sum(h, 0), 0)
}
