/* runtime/rt_train_state.c -- weights in and out, full-state checkpoints; see rt_train.h.
 *
 * Weights travel as safetensors under the model's own (Hugging Face) names.
 * A checkpoint is an rt_ckpt directory of model.safetensors, optimizer.safetensors
 * and trainer.json, so it is published atomically and read back only when
 * complete; floats are stored as their exact bits, which is what makes a resume
 * bit-for-bit. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/rt_train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_ckpt.h"
#include "runtime/rt_comm.h"
#include "runtime/rt_err.h"
#include "runtime/rt_safetensors.h"
#include "runtime/rt_shard.h"

#define MODEL_FILE "model.safetensors"
#define OPTIM_FILE "optimizer.safetensors"
#define TRAINER_FILE "trainer.json"
#define PREFIX "transformer."

/* "[256, 256]" */
static const char *shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
  size_t k = 0;
  k += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < rank && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* Name under which parameter p is stored in st: its own, else with the prefix;
 * NULL (and an error naming the tensor and its expected shape) if neither. */
static const char *stored_name(const RtSt *st, const char *path, const RtParamDesc *p,
                               const int64_t *gshape, char **alt) {
  *alt = NULL;
  if (rt_st_find(st, p->name) >= 0) return p->name;
  size_t n = strlen(PREFIX) + strlen(p->name) + 1;
  if (!(*alt = malloc(n))) {
    rt_fail("weights %s: out of memory", path);
    return NULL;
  }
  snprintf(*alt, n, "%s%s", PREFIX, p->name);
  if (rt_st_find(st, *alt) >= 0) return *alt;
  char want[200];
  rt_fail("weights %s: no tensor '%s' (nor '%s%s'); the model expects it with shape %s, "
          "found none; the file was made for another model", path, p->name, PREFIX, p->name,
          shape_str(want, sizeof want, p->rank, gshape));
  return NULL;
}

/* Parameter p's shard on tp coordinate coord, and its global shape.  With tp == 1
 * (or shard_dim < 0) the parameter is whole: dim -1 and its own shape, whatever
 * the shard fields hold, except a padded one (rt_param_padded: degree 1, its
 * true global shape).  An expert-parallel one (p->ep > 1) has its experts
 * (dimension 0) split over its ep group, ep coordinate ep_coord, no padding:
 * with shard_dim >= 1 (and tp > 1) each of them split over tp as well
 * (RtShard.edegree), else whole over tp. */
const int64_t *rt_train_param_shard(const RtParamDesc *p, int tp, int coord, int ep_coord,
                                    RtShard *sh) {
  sh->dim = -1;
  sh->degree = 1;
  sh->blocks = 1;
  sh->coord = 0;
  sh->padded = 0;
  sh->edegree = 0;
  sh->ecoord = 0;
  if (p->ep > 1 && p->shard_dim >= 1 && tp > 1) { /* the rank's experts, each split over tp */
    sh->dim = p->shard_dim;
    sh->degree = tp;
    sh->blocks = p->shard_blocks >= 1 ? p->shard_blocks : 1;
    sh->coord = coord;
    sh->edegree = p->ep;
    sh->ecoord = ep_coord;
    return p->global_shape;
  }
  if (p->ep > 1) { /* the rank's experts, whole over tp */
    sh->dim = 0;
    sh->degree = p->ep;
    sh->coord = ep_coord;
    return p->global_shape;
  }
  if (p->shard_dim < 0) return tp <= 1 ? p->shape : p->global_shape;
  if (tp <= 1 && !rt_param_padded(p, 1)) return p->shape;
  if (tp < 1) tp = 1;
  sh->dim = p->shard_dim;
  sh->degree = tp;
  sh->blocks = p->shard_blocks >= 1 ? p->shard_blocks : 1;
  sh->coord = coord;
  sh->padded = rt_param_padded(p, tp);
  return p->global_shape;
}

int rt_train_load_weights_tp(const RtModelDesc *m, float *params, const char *path, int tp,
                             int coord, int ep_coord) {
  RtSt *st;
  if (rt_st_open(&st, path)) return RT_ERR;
  int rc = RT_OK;
  for (int i = 0; i < m->nparams && rc == RT_OK; i++) {
    const RtParamDesc *p = &m->params[i];
    RtShard sh;
    const int64_t *gshape = rt_train_param_shard(p, tp, coord, ep_coord, &sh);
    char *alt;
    const char *name = stored_name(st, path, p, gshape, &alt);
    if (!name) rc = RT_ERR;
    else if (sh.dim < 0) rc = rt_st_read(st, name, params + p->offset, p->rank, gshape);
    else rc = rt_st_read_shard(st, name, params + p->offset, p->rank, gshape, &sh);
    free(alt);
  }
  rt_st_close(st);
  return rc;
}

int rt_train_load_weights(const RtModelDesc *m, float *params, const char *path) {
  return rt_train_load_weights_tp(m, params, path, 1, 0, 0);
}

/* Writes n tensors to path (the parameters, or the state as 1-D tensors). */
static int write_tensors(const char *path, const RtModelDesc *m, const float *params,
                         const float *state, int with_meta) {
  int n = params ? m->nparams : m->nstate;
  RtStTensor *t = calloc(n > 0 ? (size_t)n : 1, sizeof *t);
  if (!t) return rt_fail("%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    if (params) {
      const RtParamDesc *p = &m->params[i];
      t[i].name = p->name;
      t[i].rank = p->rank;
      for (int d = 0; d < p->rank; d++) t[i].shape[d] = p->shape[d];
      t[i].data = params + p->offset;
    } else {
      const RtStateDesc *s = &m->state[i];
      t[i].name = s->name;
      t[i].rank = 1;
      t[i].shape[0] = s->numel;
      t[i].data = state + s->offset;
    }
  }
  /* "format": "pt" is what Hugging Face loaders look for. */
  RtStMeta meta[1] = {{"format", "pt"}};
  int rc = rt_st_write(path, t, n, meta, with_meta ? 1 : 0);
  free(t);
  return rc;
}

int rt_train_save_weights(const RtModelDesc *m, const float *params, const char *path) {
  return write_tensors(path, m, params, NULL, 1);
}

/* ---- checkpoints ---- */

static char *trainer_json(const RtModelDesc *m, const RtTrainCkptInfo *info) {
  char seed[32];
  snprintf(seed, sizeof seed, "%" PRIu64, info->seed);
  cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(),
        *data = cJSON_CreateObject();
  int ok = root && model && data &&
           cJSON_AddStringToObject(root, "format", RT_TRAIN_STATE_FORMAT) &&
           cJSON_AddNumberToObject(root, "version", RT_TRAIN_STATE_VERSION) &&
           cJSON_AddNumberToObject(root, "step", (double)info->step) &&
           cJSON_AddNumberToObject(root, "next_sequence", (double)(info->step * m->batch)) &&
           cJSON_AddNumberToObject(root, "steps", (double)info->steps) &&
           cJSON_AddStringToObject(root, "seed", seed) &&
           (info->lr_set ? cJSON_AddNumberToObject(root, "lr_override", info->lr) != NULL
                         : cJSON_AddNullToObject(root, "lr_override") != NULL) &&
           cJSON_AddStringToObject(data, "name", info->data_name) &&
           cJSON_AddNumberToObject(data, "tokens", (double)info->data_tokens) &&
           cJSON_AddStringToObject(model, "name", m->name) &&
           cJSON_AddNumberToObject(model, "vocab", (double)m->vocab) &&
           cJSON_AddNumberToObject(model, "batch", (double)m->batch) &&
           cJSON_AddNumberToObject(model, "seq", (double)m->seq) &&
           cJSON_AddStringToObject(model, "optimizer", m->optimizer ? m->optimizer : "") &&
           cJSON_AddNumberToObject(model, "nparams", m->nparams) &&
           cJSON_AddNumberToObject(model, "params_numel", (double)m->params_numel) &&
           cJSON_AddNumberToObject(model, "nstate", m->nstate) &&
           cJSON_AddNumberToObject(model, "state_numel", (double)m->state_numel);
  char *text = NULL;
  if (ok) {
    cJSON_AddItemToObject(root, "data", data);
    data = NULL;
    cJSON_AddItemToObject(root, "model", model);
    model = NULL;
    text = cJSON_Print(root);
  }
  cJSON_Delete(root);
  cJSON_Delete(model);
  cJSON_Delete(data);
  return text;
}

int rt_train_save_ckpt(const char *dir, const RtModelDesc *m, const float *params,
                       const float *state, const RtTrainCkptInfo *info) {
  char *text = trainer_json(m, info);
  if (!text) return rt_fail("checkpoint %s: out of memory", dir);
  RtCkptTxn *txn;
  if (rt_ckpt_begin(&txn, dir)) {
    cJSON_free(text);
    return RT_ERR;
  }
  char path[4096];
  int rc = RT_OK;
  if (rt_ckpt_staging_path(txn, MODEL_FILE, path, sizeof path) ||
      write_tensors(path, m, params, NULL, 0) || rt_ckpt_add_written(txn, MODEL_FILE) ||
      rt_ckpt_staging_path(txn, OPTIM_FILE, path, sizeof path) ||
      write_tensors(path, m, NULL, state, 0) || rt_ckpt_add_written(txn, OPTIM_FILE) ||
      rt_ckpt_add(txn, TRAINER_FILE, text, strlen(text))) {
    rt_ckpt_abort(txn);
    rc = RT_ERR;
  } else {
    rc = rt_ckpt_commit(txn);
  }
  cJSON_free(text);
  return rc;
}

/* A whole number in [0, 2^53] from item; -1 if absent or not one. */
static int64_t json_count(const cJSON *obj, const char *key) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(it)) return -1;
  double v = it->valuedouble;
  if (!(v >= 0) || v > 9007199254740992.0 || v != floor(v)) return -1;
  return (int64_t)v;
}

/* Checks that the saved model identity equals m's; RT_ERR names the first difference. */
static int check_identity(const char *dir, const cJSON *saved, const RtModelDesc *m) {
  struct {
    const char *key;
    int64_t here;
  } nums[] = {{"vocab", m->vocab},         {"batch", m->batch},
              {"seq", m->seq},             {"nparams", m->nparams},
              {"nstate", m->nstate}};
  /* params_numel / state_numel depend on the buffer layout (gaps, the tp shards):
   * they are not compared; every tensor's name and global shape are, on reading. */
  const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(saved, "name"));
  const char *opt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(saved, "optimizer"));
  if (!name || !opt)
    return rt_fail("checkpoint %s: %s lacks the model's name or optimizer; it is damaged or "
                   "not a parc training state", dir, TRAINER_FILE);
  if (strcmp(name, m->name))
    return rt_fail("checkpoint %s was saved by model '%s', not '%s'; resume needs the model "
                   "it was saved from", dir, name, m->name);
  if (strcmp(opt, m->optimizer ? m->optimizer : ""))
    return rt_fail("checkpoint %s holds %s optimizer state but this model trains with %s; "
                   "resume needs the model it was saved from", dir, opt,
                   m->optimizer ? m->optimizer : "(none)");
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
    int64_t v = json_count(saved, nums[i].key);
    if (v != nums[i].here)
      return rt_fail("checkpoint %s: model %s is %lld there but %lld here; resume needs the "
                     "model it was saved from", dir, nums[i].key, (long long)v,
                     (long long)nums[i].here);
  }
  return RT_OK;
}

static int parse_trainer(const char *dir, const char *text, const RtModelDesc *m,
                         RtTrainCkptInfo *info) {
  cJSON *root = cJSON_Parse(text);
  int rc = RT_OK;
  const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "format"));
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  const cJSON *lr = cJSON_GetObjectItemCaseSensitive(root, "lr_override");
  const char *seed = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "seed"));
  const char *dname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(data, "name"));
  int64_t version = json_count(root, "version");
  memset(info, 0, sizeof *info);
  info->step = json_count(root, "step");
  info->steps = json_count(root, "steps");
  info->data_tokens = json_count(data, "tokens");
  int64_t next = json_count(root, "next_sequence");
  char *end = NULL;
  if (seed && seed[0] >= '0' && seed[0] <= '9') {
    errno = 0;
    info->seed = strtoull(seed, &end, 10);
    if (errno) end = NULL;
  }
  if (!cJSON_IsObject(root) || !fmt || strcmp(fmt, RT_TRAIN_STATE_FORMAT))
    rc = rt_fail("checkpoint %s: %s is not a parc training state (format '%s'); pass a "
                 "directory written with --save", dir, TRAINER_FILE, fmt ? fmt : "?");
  else if (version != RT_TRAIN_STATE_VERSION)
    rc = rt_fail("checkpoint %s: training-state version %lld; this trainer reads version %d",
                 dir, (long long)version, RT_TRAIN_STATE_VERSION);
  else if (!cJSON_IsObject(model) || !cJSON_IsObject(data) || !dname || info->step < 0 ||
           info->steps < 0 || info->data_tokens < 0 || !end || *end ||
           !(cJSON_IsNull(lr) || cJSON_IsNumber(lr)))
    rc = rt_fail("checkpoint %s: %s lacks a field or has one of the wrong type; it is "
                 "damaged", dir, TRAINER_FILE);
  else if (check_identity(dir, model, m))
    rc = RT_ERR;
  else if (next != info->step * m->batch)
    rc = rt_fail("checkpoint %s: data position %lld does not match step %lld x batch %lld; "
                 "it is damaged", dir, (long long)next, (long long)info->step,
                 (long long)m->batch);
  if (rc == RT_OK) {
    snprintf(info->data_name, sizeof info->data_name, "%s", dname);
    info->lr_set = cJSON_IsNumber(lr);
    info->lr = info->lr_set ? lr->valuedouble : 0.0;
  }
  cJSON_Delete(root);
  return rc;
}

/* ---- ZeRO-1: the state's pieces <-> whole state ---- */

static int64_t piece_of(int64_t n, int zero) { return (n + zero - 1) / zero; }

int rt_train_zero_gather(const RtModelDesc *m, RtComm *dp, RtComm *ep_dp, const float *state,
                         RtZeroView *v) {
  int zero = m->zero;
  if (zero <= 1 || rt_comm_size(dp) != zero)
    return rt_fail("zero gather: the dp group has %d ranks, the state is cut in %d pieces",
                   rt_comm_size(dp), zero);
  for (int i = 0; i < m->nstate; i++) {
    int z = rt_zero_pieces(m, &m->params[m->state[i].param]);
    if (z != zero && z > 1 && (!ep_dp || rt_comm_size(ep_dp) != z))
      return rt_fail("zero gather: state '%s' is cut in %d pieces over the ep_dp group, "
                     "which has %d ranks", m->state[i].name, z, ep_dp ? rt_comm_size(ep_dp) : 0);
  }
  if (!v->s) {
    int64_t off = 0, most = 0;
    v->s = calloc(m->nstate > 0 ? (size_t)m->nstate : 1, sizeof *v->s);
    if (!v->s) return rt_fail("zero gather: out of memory");
    for (int i = 0; i < m->nstate; i++) {
      v->s[i] = m->state[i];
      v->s[i].numel = m->params[m->state[i].param].numel;
      v->s[i].offset = off;
      off += v->s[i].numel;
      if (m->state[i].numel > most) most = m->state[i].numel;
    }
    v->m = *m;
    v->m.zero = 0;
    v->m.state = v->s;
    v->m.state_numel = off;
    v->state = malloc((size_t)(off + 1) * sizeof *v->state);
    v->scratch = malloc((size_t)(most * zero + 1) * sizeof *v->scratch);
    if (!v->state || !v->scratch)
      return rt_fail("zero gather: out of memory for %lld + %lld floats", (long long)off,
                     (long long)(most * zero));
  }
  int64_t *cnt = malloc((size_t)zero * sizeof *cnt);
  if (!cnt) return rt_fail("zero gather: out of memory");
  int rc = RT_OK;
  for (int i = 0; i < m->nstate && rc == RT_OK; i++) {
    int64_t s = m->state[i].numel;
    int z = rt_zero_pieces(m, &m->params[m->state[i].param]);
    if (z <= 1) { /* the rank's experts' whole state (ep == dp) */
      memcpy(v->state + v->s[i].offset, state + m->state[i].offset,
             (size_t)v->s[i].numel * sizeof(float));
      continue;
    }
    for (int r = 0; r < z; r++) cnt[r] = s;
    rc = rt_comm_all_gather(z == zero ? dp : ep_dp, state + m->state[i].offset, v->scratch, cnt);
    /* the pieces in rank order are the flattened tensor, then its padding */
    if (rc == RT_OK)
      memcpy(v->state + v->s[i].offset, v->scratch, (size_t)v->s[i].numel * sizeof(float));
  }
  free(cnt);
  return rc;
}

void rt_train_zero_free(RtZeroView *v) {
  free(v->s);
  free(v->state);
  free(v->scratch);
  memset(v, 0, sizeof *v);
}

/* Reads the tensors of one safetensors file of the checkpoint: exactly the
 * parameters (params != NULL) or exactly the state tensors, each as this tp
 * coordinate's shard of the whole tensor the file holds (an expert-parallel
 * parameter's and its state's: ep coordinate ep_coord's). A state tensor is stored
 * flat ([global numel]) in its parameter's global order: a sharded one is read
 * whole into a scratch buffer and its shard extracted.  Under ZeRO-1 (m->zero > 1)
 * the rank's tp-local state tensor is assembled in a scratch buffer and only the
 * piece of dp coordinate dp_coord is kept (zeros past the tensor's end); an
 * expert-parallel parameter's state: the piece of ep_dp coordinate dp_coord / ep,
 * of rt_zero_pieces (none to cut where ep == dp). */
static int read_tensors(const RtCkpt *ck, const char *file, const RtModelDesc *m,
                        float *params, float *state, int tp, int coord, int dp_coord,
                        int ep_coord) {
  char path[4096];
  RtSt *st;
  if (rt_ckpt_path(ck, file, path, sizeof path) || rt_st_open(&st, path)) return RT_ERR;
  int n = params ? m->nparams : m->nstate;
  int rc = RT_OK;
  if (rt_st_count(st) != n)
    rc = rt_fail("checkpoint %s: %s holds %d tensors but the model has %d; resume needs the "
                 "model it was saved from", rt_ckpt_dir(ck), file, rt_st_count(st), n);
  for (int i = 0; i < n && rc == RT_OK; i++) {
    if (params) {
      const RtParamDesc *p = &m->params[i];
      RtShard sh;
      const int64_t *gshape = rt_train_param_shard(p, tp, coord, ep_coord, &sh);
      if (sh.dim < 0) rc = rt_st_read(st, p->name, params + p->offset, p->rank, gshape);
      else rc = rt_st_read_shard(st, p->name, params + p->offset, p->rank, gshape, &sh);
    } else {
      const RtStateDesc *s = &m->state[i];
      RtShard sh = {.dim = -1, .degree = 1, .blocks = 1};
      const int64_t *gshape = NULL;
      int z = rt_zero_pieces(m, &m->params[s->param]), zero = z > 1;
      int zc = m->params[s->param].ep > 1 && m->ep > 1 ? dp_coord / m->ep : dp_coord;
      int64_t nl = zero ? m->params[s->param].numel : s->numel;  /* the tp-local tensor */
      float *local = zero ? malloc((size_t)(nl + 1) * sizeof *local) : state + s->offset;
      if (!local) {
        rc = rt_fail("checkpoint %s: out of memory", rt_ckpt_dir(ck));
        break;
      }
      gshape = rt_train_param_shard(&m->params[s->param], tp, coord, ep_coord, &sh);
      if (sh.dim < 0) {
        int64_t shape[1] = {nl};
        rc = rt_st_read(st, s->name, local, 1, shape);
      } else {
        const RtParamDesc *p = &m->params[s->param];
        int64_t gnumel = 1;
        for (int d = 0; d < p->rank; d++) gnumel *= gshape[d];
        float *full = malloc((size_t)(gnumel > 0 ? gnumel : 1) * sizeof *full);
        int64_t shape[1] = {gnumel};
        if (!full) rc = rt_fail("checkpoint %s: out of memory", rt_ckpt_dir(ck));
        else if ((rc = rt_st_read(st, s->name, full, 1, shape)) == RT_OK)
          rc = rt_shard_extract(full, local, p->rank, gshape, &sh);
        free(full);
      }
      if (zero) {
        int64_t k = s->numel, b = (int64_t)zc * k;
        int64_t have = nl - b < 0 ? 0 : nl - b < k ? nl - b : k;
        if (rc == RT_OK && k != piece_of(nl, z))
          rc = rt_fail("checkpoint %s: state '%s' has a piece of %lld floats, not %lld",
                       rt_ckpt_dir(ck), s->name, (long long)k, (long long)piece_of(nl, z));
        if (rc == RT_OK) {
          if (have > 0) memcpy(state + s->offset, local + b, (size_t)have * sizeof(float));
          memset(state + s->offset + have, 0, (size_t)(k - have) * sizeof(float));
        }
        free(local);
      }
    }
  }
  rt_st_close(st);
  return rc;
}

int rt_train_load_ckpt(const char *dir, const RtModelDesc *m, float *params, float *state,
                       RtTrainCkptInfo *info) {
  return rt_train_load_ckpt_tp(dir, m, params, state, info, 1, 0);
}

int rt_train_load_ckpt_tp(const char *dir, const RtModelDesc *m, float *params, float *state,
                          RtTrainCkptInfo *info, int tp, int coord) {
  return rt_train_load_ckpt_mesh(dir, m, params, state, info, tp, coord, 0, 0);
}

int rt_train_load_ckpt_mesh(const char *dir, const RtModelDesc *m, float *params, float *state,
                            RtTrainCkptInfo *info, int tp, int coord, int dp_coord,
                            int ep_coord) {
  RtCkpt *ck;
  if (rt_ckpt_open(&ck, dir)) return RT_ERR;
  void *text = NULL;
  size_t len;
  int rc = rt_ckpt_read(ck, TRAINER_FILE, &text, &len);
  if (rc == RT_OK) {
    /* rt_ckpt_read's buffer is NUL-terminated only through rt_fs; copy to be sure. */
    char *s = malloc(len + 1);
    if (!s) rc = rt_fail("checkpoint %s: out of memory", dir);
    else {
      memcpy(s, text, len);
      s[len] = 0;
      rc = parse_trainer(dir, s, m, info);
      free(s);
    }
  }
  free(text);
  if (rc == RT_OK)
    rc = read_tensors(ck, MODEL_FILE, m, params, NULL, tp, coord, dp_coord, ep_coord);
  if (rc == RT_OK)
    rc = read_tensors(ck, OPTIM_FILE, m, NULL, state, tp, coord, dp_coord, ep_coord);
  rt_ckpt_close(ck);
  return rc;
}
