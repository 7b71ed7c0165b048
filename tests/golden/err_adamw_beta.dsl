# Adam's betas are decay rates in [0, 1): a DSL error at the value, not a
# failure of the optimizer pass (found by the fuzzer: beta1 = 1.9).
model m {
  input x : [2, 4]
  param w : [4, 4]
  loss = mean(sum(matmul(x, w), 1), 0)
}
train {
  optimizer = adamw(beta1 = 1.9, beta2 = 1.0)
}
