/*
 * A plain float32 forward of a llama2.c legacy checkpoint, written in the style of Karpathy's
 * run.c (rmsnorm, matmul, RoPE, grouped-query attention over an f32 cache, SwiGLU), so that
 * bench/model.ts can time our TypeScript decode against the C loop it is measured by.
 * Built two ways, as llama2.c's Makefile builds run.c:
 *   `make run`:    gcc -O3 -o run_ref run_ref.c -lm
 *   `make runomp`: gcc -Ofast -fopenmp -march=native -o run_ref run_ref.c -lm  (OMP_NUM_THREADS = cores)
 * The pragmas are run.c's: matmul rows and attention heads split across OpenMP threads.
 *
 * usage: run_ref CHECKPOINT STEPS [TOKEN [BATCH]]
 * Starts from TOKEN (default 1, BOS) at position 0 and decodes STEPS positions greedily.
 * Prints "tokens: t1 t2 ..." (the argmax after each position) and "tok/s: X", timed like
 * run.c: from the end of the first step to the end of the last.
 * BATCH (default 1) sequences decode in lockstep, sequence b from TOKEN + b, each matrix read once
 * a step for all of them (matmul_batch): the batched decode run.c would be with the same
 * pragmas, so bench/model.ts can set our batch 8 over batch 1 beside C's on the same machine.
 * "tokens:" is sequence 0's; tok/s counts every sequence's tokens. BATCH 1 runs run.c's own loop.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; } Config;

typedef struct {
  float *token_embedding, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
} Weights;

typedef struct {
  float *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits, *key_cache, *value_cache;
} RunState;

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
  return p;
}

static void rmsnorm(float *o, const float *x, const float *weight, int size) {
  float ss = 0.0f;
  for (int j = 0; j < size; j++) ss += x[j] * x[j];
  ss /= size;
  ss += 1e-5f;
  ss = 1.0f / sqrtf(ss);
  for (int j = 0; j < size; j++) o[j] = weight[j] * (ss * x[j]);
}

static void softmax(float *x, int size) {
  float max_val = x[0];
  for (int i = 1; i < size; i++) if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int i = 0; i < size; i++) { x[i] = expf(x[i] - max_val); sum += x[i]; }
  for (int i = 0; i < size; i++) x[i] /= sum;
}

/* W (d,n) @ x (n,) -> xout (d,): the loop run.c spends its time in. */
static void matmul(float *xout, const float *x, const float *w, int n, int d) {
  int i;
#pragma omp parallel for private(i)
  for (i = 0; i < d; i++) {
    float val = 0.0f;
    for (int j = 0; j < n; j++) val += w[i * n + j] * x[j];
    xout[i] = val;
  }
}

/*
 * W (d,n) @ x (B,n) -> xout (B,d): each row of W once from memory, then from cache for the other
 * sequences' dots, each dot as matmul's.
 */
static void matmul_batch(float *xout, const float *x, const float *w, int n, int d, int B) {
  if (B == 1) {
    matmul(xout, x, w, n, d);
    return;
  }
  int i;
#pragma omp parallel for private(i)
  for (i = 0; i < d; i++) {
    const float *wi = w + (size_t)i * n;
    for (int b = 0; b < B; b++) {
      const float *xb = x + (size_t)b * n;
      float val = 0.0f;
      for (int j = 0; j < n; j++) val += wi[j] * xb[j];
      xout[(size_t)b * d + i] = val;
    }
  }
}

/* RoPE at pos on q (dim) and k (kv_dim), pairs (i, i + 1) as run.c rotates them. */
static void rope(float *q, float *k, int dim, int kv_dim, int head_size, int pos) {
  for (int i = 0; i < dim; i += 2) {
    int head_dim = i % head_size;
    float freq = 1.0f / powf(10000.0f, head_dim / (float)head_size);
    float val = pos * freq, fcr = cosf(val), fci = sinf(val);
    int rotn = i < kv_dim ? 2 : 1;
    for (int vi = 0; vi < rotn; vi++) {
      float *vec = vi == 0 ? q : k;
      float v0 = vec[i], v1 = vec[i + 1];
      vec[i] = v0 * fcr - v1 * fci;
      vec[i + 1] = v0 * fci + v1 * fcr;
    }
  }
}

/*
 * One head's attention at pos, as run.c's head loop: q against positions 0..pos of the layer's
 * caches kc and vc (kv_dim floats a position, this head's KV slice at kv_off), softmax into att,
 * the weighted values into xb.
 */
static void attend_head(float *xb, const float *q, const float *kc, const float *vc, float *att, int kv_off, int head_size, int kv_dim, int pos) {
  for (int t = 0; t <= pos; t++) {
    const float *kt = kc + t * kv_dim + kv_off;
    float score = 0.0f;
    for (int i = 0; i < head_size; i++) score += q[i] * kt[i];
    att[t] = score / sqrtf(head_size);
  }
  softmax(att, pos + 1);
  memset(xb, 0, head_size * sizeof(float));
  for (int t = 0; t <= pos; t++) {
    const float *vt = vc + t * kv_dim + kv_off;
    float a = att[t];
    for (int i = 0; i < head_size; i++) xb[i] += a * vt[i];
  }
}

static float *forward(const Config *p, const Weights *w, RunState *s, int token, int pos) {
  int dim = p->dim, hidden_dim = p->hidden_dim, head_size = dim / p->n_heads;
  int kv_dim = (p->dim * p->n_kv_heads) / p->n_heads;
  int kv_mul = p->n_heads / p->n_kv_heads;
  float *x = s->x;
  memcpy(x, w->token_embedding + (size_t)token * dim, dim * sizeof(float));
  for (int l = 0; l < p->n_layers; l++) {
    rmsnorm(s->xb, x, w->rms_att + l * dim, dim);
    size_t loff = (size_t)l * p->seq_len * kv_dim;
    float *k = s->key_cache + loff + pos * kv_dim;
    float *v = s->value_cache + loff + pos * kv_dim;
    matmul(s->q, s->xb, w->wq + (size_t)l * dim * dim, dim, dim);
    matmul(k, s->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim);
    matmul(v, s->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim);
    rope(s->q, k, dim, kv_dim, head_size, pos);
    int h;
#pragma omp parallel for private(h)
    for (h = 0; h < p->n_heads; h++) {
      attend_head(s->xb + h * head_size, s->q + h * head_size, s->key_cache + loff, s->value_cache + loff, s->att + h * p->seq_len,
                  (h / kv_mul) * head_size, head_size, kv_dim, pos);
    }
    matmul(s->xb2, s->xb, w->wo + (size_t)l * dim * dim, dim, dim);
    for (int i = 0; i < dim; i++) x[i] += s->xb2[i];
    rmsnorm(s->xb, x, w->rms_ffn + l * dim, dim);
    matmul(s->hb, s->xb, w->w1 + (size_t)l * dim * hidden_dim, dim, hidden_dim);
    matmul(s->hb2, s->xb, w->w3 + (size_t)l * dim * hidden_dim, dim, hidden_dim);
    for (int i = 0; i < hidden_dim; i++) {
      float val = s->hb[i];
      val *= 1.0f / (1.0f + expf(-val));
      s->hb[i] = val * s->hb2[i];
    }
    matmul(s->xb, s->hb, w->w2 + (size_t)l * dim * hidden_dim, hidden_dim, dim);
    for (int i = 0; i < dim; i++) x[i] += s->xb[i];
  }
  rmsnorm(x, x, w->rms_final, dim);
  matmul(s->logits, x, w->wcls, p->dim, p->vocab_size);
  return s->logits;
}

/*
 * forward for B sequences at the same position: the state's arrays hold B rows (s->x row b is
 * sequence b's) and the caches B slabs, one per sequence. Every matrix goes through matmul_batch,
 * and attention splits (sequence, head) pairs across the threads as forward splits heads.
 */
static float *forward_batch(const Config *p, const Weights *w, RunState *s, const int *tokens, int pos, int B) {
  int dim = p->dim, hidden_dim = p->hidden_dim, head_size = dim / p->n_heads;
  int kv_dim = (p->dim * p->n_kv_heads) / p->n_heads;
  int kv_mul = p->n_heads / p->n_kv_heads;
  size_t slab = (size_t)p->n_layers * p->seq_len * kv_dim;
  float *x = s->x;
  for (int b = 0; b < B; b++) memcpy(x + (size_t)b * dim, w->token_embedding + (size_t)tokens[b] * dim, dim * sizeof(float));
  for (int l = 0; l < p->n_layers; l++) {
    for (int b = 0; b < B; b++) rmsnorm(s->xb + (size_t)b * dim, x + (size_t)b * dim, w->rms_att + l * dim, dim);
    size_t loff = (size_t)l * p->seq_len * kv_dim;
    matmul_batch(s->q, s->xb, w->wq + (size_t)l * dim * dim, dim, dim, B);
    matmul_batch(s->k, s->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim, B);
    matmul_batch(s->v, s->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim, B);
    for (int b = 0; b < B; b++) {
      float *q = s->q + (size_t)b * dim, *k = s->k + (size_t)b * kv_dim;
      rope(q, k, dim, kv_dim, head_size, pos);
      memcpy(s->key_cache + b * slab + loff + (size_t)pos * kv_dim, k, kv_dim * sizeof(float));
      memcpy(s->value_cache + b * slab + loff + (size_t)pos * kv_dim, s->v + (size_t)b * kv_dim, kv_dim * sizeof(float));
    }
    int bh;
#pragma omp parallel for private(bh)
    for (bh = 0; bh < B * p->n_heads; bh++) {
      int b = bh / p->n_heads, h = bh % p->n_heads;
      attend_head(s->xb + (size_t)b * dim + h * head_size, s->q + (size_t)b * dim + h * head_size, s->key_cache + b * slab + loff,
                  s->value_cache + b * slab + loff, s->att + (size_t)bh * p->seq_len, (h / kv_mul) * head_size, head_size, kv_dim, pos);
    }
    matmul_batch(s->xb2, s->xb, w->wo + (size_t)l * dim * dim, dim, dim, B);
    for (size_t i = 0; i < (size_t)B * dim; i++) x[i] += s->xb2[i];
    for (int b = 0; b < B; b++) rmsnorm(s->xb + (size_t)b * dim, x + (size_t)b * dim, w->rms_ffn + l * dim, dim);
    matmul_batch(s->hb, s->xb, w->w1 + (size_t)l * dim * hidden_dim, dim, hidden_dim, B);
    matmul_batch(s->hb2, s->xb, w->w3 + (size_t)l * dim * hidden_dim, dim, hidden_dim, B);
    for (size_t i = 0; i < (size_t)B * hidden_dim; i++) {
      float val = s->hb[i];
      val *= 1.0f / (1.0f + expf(-val));
      s->hb[i] = val * s->hb2[i];
    }
    matmul_batch(s->xb, s->hb, w->w2 + (size_t)l * dim * hidden_dim, hidden_dim, dim, B);
    for (size_t i = 0; i < (size_t)B * dim; i++) x[i] += s->xb[i];
  }
  for (int b = 0; b < B; b++) rmsnorm(x + (size_t)b * dim, x + (size_t)b * dim, w->rms_final, dim);
  matmul_batch(s->logits, x, w->wcls, p->dim, p->vocab_size, B);
  return s->logits;
}

static long time_in_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s CHECKPOINT STEPS [TOKEN]\n", argv[0]); return 1; }
  int steps = atoi(argv[2]);
  int token = argc > 3 ? atoi(argv[3]) : 1;
  int B = argc > 4 ? atoi(argv[4]) : 1;
  if (B < 1 || B > 64) { fprintf(stderr, "BATCH %d: want 1..64\n", B); return 1; }
  FILE *f = fopen(argv[1], "rb");
  if (!f) { fprintf(stderr, "cannot open %s\n", argv[1]); return 1; }
  Config p;
  if (fread(&p, sizeof(int), 7, f) != 7) { fprintf(stderr, "short header\n"); return 1; }
  int shared = p.vocab_size > 0;
  p.vocab_size = abs(p.vocab_size);
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f) - 7 * sizeof(int);
  fseek(f, 7 * sizeof(int), SEEK_SET);
  float *data = xcalloc(bytes / sizeof(float), sizeof(float));
  if (fread(data, 1, bytes, f) != (size_t)bytes) { fprintf(stderr, "short read\n"); return 1; }
  fclose(f);

  /* run.c's memory_map_weights: tensors in file order, skipping the legacy RoPE tables. */
  int head_size = p.dim / p.n_heads, kv_dim = p.dim * p.n_kv_heads / p.n_heads;
  size_t L = p.n_layers;
  Weights w;
  float *ptr = data;
  w.token_embedding = ptr; ptr += (size_t)p.vocab_size * p.dim;
  w.rms_att = ptr; ptr += L * p.dim;
  w.wq = ptr; ptr += L * p.dim * p.dim;
  w.wk = ptr; ptr += L * p.dim * kv_dim;
  w.wv = ptr; ptr += L * p.dim * kv_dim;
  w.wo = ptr; ptr += L * p.dim * p.dim;
  w.rms_ffn = ptr; ptr += L * p.dim;
  w.w1 = ptr; ptr += L * p.dim * p.hidden_dim;
  w.w2 = ptr; ptr += L * p.hidden_dim * p.dim;
  w.w3 = ptr; ptr += L * p.dim * p.hidden_dim;
  w.rms_final = ptr; ptr += p.dim;
  ptr += (size_t)p.seq_len * head_size; /* freq_cis_real and freq_cis_imag */
  w.wcls = shared ? w.token_embedding : ptr;
  if (!shared) ptr += (size_t)p.vocab_size * p.dim;
  if ((char *)ptr - (char *)data != bytes) { fprintf(stderr, "checkpoint size does not match header\n"); return 1; }

  RunState s;
  s.x = xcalloc((size_t)B * p.dim, sizeof(float));
  s.xb = xcalloc((size_t)B * p.dim, sizeof(float));
  s.xb2 = xcalloc((size_t)B * p.dim, sizeof(float));
  s.hb = xcalloc((size_t)B * p.hidden_dim, sizeof(float));
  s.hb2 = xcalloc((size_t)B * p.hidden_dim, sizeof(float));
  s.q = xcalloc((size_t)B * p.dim, sizeof(float));
  s.k = xcalloc((size_t)B * kv_dim, sizeof(float));
  s.v = xcalloc((size_t)B * kv_dim, sizeof(float));
  s.att = xcalloc((size_t)B * p.n_heads * p.seq_len, sizeof(float));
  s.logits = xcalloc((size_t)B * p.vocab_size, sizeof(float));
  s.key_cache = xcalloc((size_t)B * L * p.seq_len * kv_dim, sizeof(float));
  s.value_cache = xcalloc((size_t)B * L * p.seq_len * kv_dim, sizeof(float));
  int tokens[64];
  for (int b = 0; b < B; b++) tokens[b] = (token + b) % p.vocab_size;

  if (steps > p.seq_len) steps = p.seq_len;
  long start = 0;
  printf("tokens:");
  for (int pos = 0; pos < steps; pos++) {
    float *logits = B == 1 ? forward(&p, &w, &s, tokens[0], pos) : forward_batch(&p, &w, &s, tokens, pos, B);
    for (int b = 0; b < B; b++) {
      const float *lb = logits + (size_t)b * p.vocab_size;
      int next = 0;
      for (int i = 1; i < p.vocab_size; i++) if (lb[i] > lb[next]) next = i;
      tokens[b] = next;
    }
    printf(" %d", tokens[0]);
    if (pos == 0) start = time_in_ms();
  }
  long end = time_in_ms();
  printf("\n");
  if (steps > 1) printf("tok/s: %f\n", (double)B * (steps - 1) / (double)(end - start) * 1000);
  return 0;
}
