# ARGS: --tp 2 --pp 2 --dp 2 -D layers=3
# The report for a sharded, pipelined layout: vocab padding, stages.
model gpt {
  config { vocab = 17  seq = 4  d = 8  heads = 2  layers = 1 }
  input tokens : i32[batch, seq]
  input targets : i32[batch, seq]
  x = embed(tokens, vocab, d) as wte + positions(seq, d) as wpe
  repeat layers as h {
    x = x + attention(layernorm(x) as ln_1, heads) as attn
    x = x + mlp(layernorm(x) as ln_2, 4 * d) as mlp
  }
  loss = cross_entropy(tied_head(layernorm(x) as ln_f, wte.weight), targets)
}
train { batch = 4 }
