# ARGS: -D layers=2
# bf16: the report adds the GPU trainer's GEMM operand copies, the largest a
# GEMM converts to bf16 per operand slot (rt_cuda_ws_plan.h): now weights and
# the outputs of GEMMs and attention.  Not the tied head's dlogits (128 x 320 x 2,
# vocabulary padded to 320) nor the activations and their gradients (the MLP's
# hidden gradient, 128 x 256, before): the trainer stores those as bf16
# (codegen/cuda_store.h).  The predicted memory-bound bytes count them at 2.
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
