# ARGS: -D layers=2
# bf16: the report adds the GPU trainer's GEMM operand copies, the largest a
# GEMM reads as bf16 per operand: the MLP's hidden gradient (128 x 256 x 2
# bytes) as an a (its dx) and as a b (c_fc's weight gradient).  Not the tied
# head's dlogits (128 x 320 x 2, vocabulary padded to 320) nor the layer norm
# and GELU outputs: the trainer stores those as bf16 (codegen/cuda_store.h).
model gpt {
  config { vocab = 300  seq = 32  d = 64  heads = 4  layers = 1 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte + positions(seq, d) as wpe
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads) as attn
    x = x + mlp(layernorm(x) as ln_2, 4 * d) as mlp
  }
  loss = cross_entropy(tied_head(layernorm(x) as ln_f, wte.weight), targets)
}
train { batch = 4  precision = bf16 }
