# The parc prelude: the standard blocks, written in the DSL itself.
# The compiler core knows only primitives; everything here is ordinary DSL
# that a user may copy, change or shadow with a block of the same name.
#
# Parameter names follow Hugging Face's checkpoints: a call labelled with
# `as NAME` puts its parameters under NAME (h.0.attn.c_attn.weight).
# Sharding intents are roles: `column` splits a weight's output features,
# `row` its input features, `vocab` the rows of an embedding table, `expert`
# the leading expert dimension (`expert(d)`: and dimension d of each over tp).  A 1-d bias follows its weight: split with
# a column-parallel weight, replicated with a row-parallel one (it is added
# after the partial sums are reduced).

# GPT-2's Conv1D: y = x @ weight + bias, weight [in, out].
block conv1d(x, out, split = replicated, std = 0.02) {
  param weight : [dim(x, -1), out] init normal(std) shard split
  param bias : [out] init zeros shard split
  return matmul(x, weight) + bias
}

# Hugging Face nn.Linear without bias: y = x @ weight^T, weight [out, in].
block linear(x, out, split = replicated, std = 0.02) {
  param weight : [out, dim(x, -1)] init normal(std) shard split
  return matmul(x, weight, transpose_b = 1)
}

block layernorm(x, eps = 1e-5) {
  param weight : [dim(x, -1)] init ones
  param bias : [dim(x, -1)] init zeros
  return layer_norm(x, weight, bias, eps = eps)
}

block rmsnorm(x, eps = 1e-5) {
  param weight : [dim(x, -1)] init ones
  return rms_norm(x, weight, eps = eps)
}

# Token embedding, rows split over tensor-parallel ranks (vocab-parallel).
block embed(ids, vocab, d, std = 0.02) {
  param weight : [vocab, d] init normal(std) shard vocab
  return embedding(ids, weight)
}

# Learned absolute positions, added to a [batch, seq, d] activation.
block positions(seq, d, std = 0.01) {
  param weight : [seq, d] init normal(std)
  return weight
}

# GPT-2 attention: fused q, k, v projection (c_attn), causal, output c_proj.
block attention(x, heads, proj_std = 0.02) {
  d = dim(x, -1)
  qkv = conv1d(x, 3 * d, split = column) as c_attn
  q = split_heads(slice(qkv, -1, 0, d), heads)
  k = split_heads(slice(qkv, -1, d, d), heads)
  v = split_heads(slice(qkv, -1, 2 * d, d), heads)
  y = merge_heads(sdpa(q, k, v, causal = 1))
  return conv1d(y, d, split = row, std = proj_std) as c_proj
}

# Llama attention: grouped-query heads, rotary positions, no biases.
block gqa_attention(x, heads, kv_heads = heads, theta = 10000.0) {
  d = dim(x, -1)
  hd = d / heads
  q = split_heads(linear(x, heads * hd, split = column) as q_proj, heads)
  k = split_heads(linear(x, kv_heads * hd, split = column) as k_proj, kv_heads)
  v = split_heads(linear(x, kv_heads * hd, split = column) as v_proj, kv_heads)
  y = sdpa(rope(q, theta = theta), rope(k, theta = theta), v, causal = 1)
  return linear(merge_heads(y), d, split = row) as o_proj
}

# GPT-2 MLP: c_fc, activation (tanh GELU by default), c_proj.
block mlp(x, hidden, act = gelu, proj_std = 0.02) {
  h = conv1d(x, hidden, split = column) as c_fc
  return conv1d(act(h), dim(x, -1), split = row, std = proj_std) as c_proj
}

# Llama MLP: down(silu(gate(x)) * up(x)).
block swiglu(x, hidden) {
  g = linear(x, hidden, split = column) as gate_proj
  u = linear(x, hidden, split = column) as up_proj
  return linear(silu(g) * u, dim(x, -1), split = row) as down_proj
}

# LM heads: tied to an embedding table, or their own [vocab, d] weight.
block tied_head(x, table) {
  return matmul(x, table, transpose_b = 1)
}

block lm_head(x, vocab, std = 0.02) {
  param weight : [vocab, dim(x, -1)] init normal(std) shard vocab
  return matmul(x, weight, transpose_b = 1)
}

# log(sum(exp(z))) over the last dimension of z, keeping it (size 1), in a
# form that neither overflows nor underflows: z_j - log(p_j) for j the
# argmax of p = softmax(z), where p_j >= 1 / dim(z, -1).  Its gradient is
# p, as logsumexp's.  Pass p when the softmax is at hand already.
block logsumexp(z, p = softmax(z)) {
  j = topk(p, 1)
  return gather(z, j) - log(gather(p, j))
}

# Mixtral-style sparse MoE over x [batch, seq, d]: a router (gate) softmax
# over all experts, top_k chosen with weights renormalised to sum 1, SwiGLU
# experts (w1 gate, w3 up, w2 down, each [out, in] per expert) or, with
# gelu_experts = 1, GELU MLP experts (w1 up, w2 down; Switch/GShard style),
# the weighted sum of the chosen experts' outputs.  Experts split over ep (their leading
# dimension) and each over tp like a dense MLP: w1, w3 on their hidden outputs, w2 on
# its hidden inputs (expert(1), expert(2)).  capacity_factor 0 is dropless; else
# each expert takes ceil(factor * tokens * top_k / experts) tokens, in token
# order, and drops the rest.
# Load-balancing loss: aux_loss * E * sum_e f_e * P_e (0 turns it off).
# Router z-loss (ST-MoE): z_loss * the mean over tokens of
# logsumexp(router logits)^2.  Shared expert (DeepSeek): shared_hidden > 0
# adds to the routed output a SwiGLU MLP of that width applied to every
# token (parameters shared_experts.{gate,up,down}_proj, split over tp as
# swiglu's).  Both are optional through `if` (its condition a number known
# when the model is built, true unless 0): at their defaults, 0, their
# statements are never evaluated, so the block builds exactly the model
# without them -- no node, no parameter, nothing at run time -- and one
# block keeps one set of parameter names (a second block wrapping moe
# would nest them under its own scope).
block moe(x, experts, top_k, hidden, aux_loss = 0.01, capacity_factor = 0.0, z_loss = 0.0,
          shared_hidden = 0, gelu_experts = 0) {
  d = dim(x, -1)
  n = dim(x, 0) * dim(x, 1)
  t = reshape(x, n, d)
  logits = linear(t, experts) as gate
  probs = softmax(logits)
  idx = topk(probs, top_k)
  w = gather(probs, idx)
  w = w / sum(w, -1, keepdim = 1)
  e = dispatch(t, idx, experts = experts, capacity_factor = capacity_factor)
  if gelu_experts {
    param w1 : [experts, hidden, d] shard expert(1)
    param w2 : [experts, d, hidden] shard expert(2)
    h = gelu(matmul(e, w1, transpose_b = 1))
  }
  if 1 - gelu_experts {
    param w1 : [experts, hidden, d] shard expert(1)
    param w3 : [experts, hidden, d] shard expert(1)
    param w2 : [experts, d, hidden] shard expert(2)
    h = silu(matmul(e, w1, transpose_b = 1)) * matmul(e, w3, transpose_b = 1)
  }
  y = combine(matmul(h, w2, transpose_b = 1), idx, w)
  f = sum(sum(onehot(idx, experts), 1), 0) / (n * top_k)
  add_loss(sum(f * mean(probs, 0), 0), experts * aux_loss)
  if z_loss {
    z = logsumexp(logits, probs)
    add_loss(mean(sum(z * z, -1), 0), z_loss)
  }
  y = reshape(y, dim(x, 0), dim(x, 1), d)
  if shared_hidden {
    y = y + swiglu(x, shared_hidden) as shared_experts
  }
  return y
}
