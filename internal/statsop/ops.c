#include "ops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "round.h"

// api is the OrtApi table the kernel calls; fa_ops_init sets it before any
// session can use the operator.
static const void *api;

static OrtStatus *fail(const char *msg) { return ORTC_FN(api, ortc_CreateStatus)(ortc_err_invalid_argument, msg); }

// fail_after counts down to the allocation fa_fail_allocs asked to fail.
static atomic_int fail_after;

void fa_fail_allocs(int n) { atomic_store(&fail_after, n); }

// failing reports whether this allocation is the one to fail.
static int failing(void) {
	int k = atomic_load(&fail_after);
	while (k > 0 && !atomic_compare_exchange_weak(&fail_after, &k, k - 1)) {
	}
	return k == 1;
}

// fa_malloc is malloc with the tests' failures.
static void *fa_malloc(size_t n) { return failing() ? NULL : malloc(n); }

void *fa_calloc(size_t n, size_t size) { return failing() ? NULL : calloc(n, size); }

// tile_len is how many elements of each input one tile covers: a few
// tiles of all inputs stay in the core's L2 cache, so the reference tile
// read for input 0 is still there when inputs 1..m compare with it.
enum { tile_len = 1 << 14 };

// job is one call's work: m inputs cut into chunks. Inputs as long as x0
// (same) share its chunks and are tiled with it; others are observed on
// their own and compared over the common prefix, as audit does when a
// shape depends on values.
typedef struct {
	int m;
	const float **x;
	int64_t *n;
	int *same;
	int64_t chunk; // chunk length
	int64_t k;     // chunks of x0
	fa_stats *parts; // [m][k], then the chunks of the other inputs
	fa_diff *diffs;
	int64_t *kk;   // chunks per input
	int64_t *base; // first slot of each input in parts/diffs
} job;

static inline int64_t chunks(int64_t n, int64_t len) {
	int64_t k = (n + len - 1) / len;
	return k < 1 ? 1 : k;
}

// shared_chunk observes chunk c of x0 and of every input the same length,
// tile by tile.
static void shared_chunk(job *j, int64_t c) {
	int64_t n = j->n[0];
	int64_t lo = c * n / j->k, hi = (c + 1) * n / j->k, len = hi - lo, len8 = len - len % 8;
	fa_state st[j->m];
	fa_dstate dt[j->m];
	for (int i = 0; i < j->m; i++) {
		fa_state_init(&st[i]);
		fa_dstate_init(&dt[i]);
	}
	const float *ref = j->x[0] + lo;
	for (int64_t t = 0; t < len8; t += tile_len) {
		int64_t te = t + tile_len < len8 ? t + tile_len : len8;
		fa_blocks(&st[0], ref, t, te);
		for (int i = 1; i < j->m; i++) {
			if (j->same[i]) {
				fa_blocks_diff(&st[i], &dt[i], j->x[i] + lo, ref, t, te);
			}
		}
	}
	for (int i = 0; i < j->m; i++) {
		if (i > 0 && !j->same[i]) {
			continue;
		}
		fa_stats *p = &j->parts[j->base[i] + c];
		fa_finish(&st[i], j->x[i] + lo, len8, len, p);
		if (p->argmax >= 0) {
			p->argmax += lo;
		}
		if (i > 0) {
			fa_diff_finish(&dt[i], j->x[i] + lo, ref, len8, len, &j->diffs[j->base[i] + c]);
		}
	}
}

// own_chunk observes chunk c of input i, whose length differs from x0's.
static void own_chunk(job *j, int i, int64_t c) {
	int64_t n = j->n[i], nref = j->n[0];
	int64_t lo = c * n / j->kk[i], hi = (c + 1) * n / j->kk[i];
	fa_stats *p = &j->parts[j->base[i] + c];
	fa_kernel(j->x[i] + lo, hi - lo, p);
	if (p->argmax >= 0) {
		p->argmax += lo;
	}
	int64_t dlo = lo < nref ? lo : nref, dhi = hi < nref ? hi : nref;
	fa_diff_observe(j->x[i] + dlo, j->x[0] + dlo, dhi - dlo, &j->diffs[j->base[i] + c]);
}

// work runs iteration it: the shared chunks first, then the others'.
static void work(void *user, size_t it) {
	job *j = (job *)user;
	int64_t c = (int64_t)it;
	if (c < j->k) {
		shared_chunk(j, c);
		return;
	}
	c -= j->k;
	for (int i = 1; i < j->m; i++) {
		if (j->same[i]) {
			continue;
		}
		if (c < j->kk[i]) {
			own_chunk(j, i, c);
			return;
		}
		c -= j->kk[i];
	}
}

// job_alloc sizes the job; it returns the number of iterations, or -1
// when out of memory.
static int64_t job_alloc(job *j) {
	j->same = fa_calloc((size_t)j->m, sizeof(int));
	j->kk = fa_calloc((size_t)j->m, sizeof(int64_t));
	j->base = fa_calloc((size_t)j->m, sizeof(int64_t));
	if (j->same == NULL || j->kk == NULL || j->base == NULL) {
		return -1;
	}
	j->k = chunks(j->n[0], j->chunk);
	int64_t slots = 0, iters = j->k;
	for (int i = 0; i < j->m; i++) {
		j->same[i] = i == 0 || j->n[i] == j->n[0];
		j->kk[i] = j->same[i] ? j->k : chunks(j->n[i], j->chunk);
		j->base[i] = slots;
		slots += j->kk[i];
		if (!j->same[i]) {
			iters += j->kk[i];
		}
	}
	j->parts = fa_malloc(sizeof(fa_stats) * (size_t)slots);
	j->diffs = fa_malloc(sizeof(fa_diff) * (size_t)slots);
	if (j->parts == NULL || j->diffs == NULL) {
		return -1;
	}
	return iters;
}

static void job_free(job *j) {
	free(j->same);
	free(j->kk);
	free(j->base);
	free(j->parts);
	free(j->diffs);
}

static void fa_record(int64_t *rec, const fa_stats *s, const fa_diff *d, size_t rank, const int64_t *dims) {
	memset(rec, 0, sizeof(int64_t) * FA_REC_LEN);
	rec[FA_REC_COUNT] = s->count;
	rec[FA_REC_MAXABS] = s->maxabs;
	rec[FA_REC_ARGMAX] = s->argmax;
	rec[FA_REC_MINNZ] = s->minnz;
	memcpy(&rec[FA_REC_SUM], &s->sum, 8);
	memcpy(&rec[FA_REC_SUMSQ], &s->sumsq, 8);
	rec[FA_REC_FINITE] = s->finite;
	rec[FA_REC_NAN] = s->nan;
	rec[FA_REC_POSINF] = s->posinf;
	rec[FA_REC_NEGINF] = s->neginf;
	rec[FA_REC_ZEROS] = s->zeros;
	rec[FA_REC_ABOVE] = s->above;
	rec[FA_REC_SUBNORMAL] = s->subnormal;
	rec[FA_REC_FLUSH] = s->flush;
	if (d != NULL) {
		rec[FA_REC_HASDIFF] = 1;
		memcpy(&rec[FA_REC_SUMSQDIFF], &d->sumsqdiff, 8);
		memcpy(&rec[FA_REC_SUMSQREF], &d->sumsqref, 8);
		rec[FA_REC_NEWNF] = d->newnf;
		rec[FA_REC_NZREF] = d->nzref;
		rec[FA_REC_FLUSHED] = d->flushed;
		rec[FA_REC_BOTHFIN] = d->bothfin;
	}
	rec[FA_REC_RANK] = (int64_t)rank;
	for (size_t i = 0; i < rank && i < FA_REC_MAXDIMS; i++) {
		rec[FA_REC_DIMS + i] = dims[i];
	}
}

// job_records merges each input's chunks in index order into its record:
// the statistics as Stats.Merge from NewStats, the differences added from
// zero (audit's per-batch fold; see the package documentation).
static void job_records(const job *j, int64_t *rec, const size_t *ranks, const int64_t *dims) {
	for (int i = 0; i < j->m; i++) {
		fa_stats s;
		fa_stats_init(&s);
		fa_diff d;
		memset(&d, 0, sizeof d);
		for (int64_t c = 0; c < j->kk[i]; c++) {
			fa_stats_merge(&s, &j->parts[j->base[i] + c]);
			if (i > 0) {
				fa_diff_add(&d, &j->diffs[j->base[i] + c]);
			}
		}
		fa_record(rec + (size_t)i * FA_REC_LEN, &s, i > 0 ? &d : NULL, ranks[i], dims + (size_t)i * FA_REC_MAXDIMS);
	}
}

int fa_observe(int m, const float *const *x, const int64_t *n, int64_t chunk, int64_t *rec) {
	job j;
	memset(&j, 0, sizeof j);
	j.m = m;
	j.chunk = chunk;
	j.x = (const float **)x;
	j.n = (int64_t *)n;
	int64_t iters = job_alloc(&j);
	if (iters < 0) {
		job_free(&j);
		return -1;
	}
	for (int64_t it = 0; it < iters; it++) {
		work(&j, (size_t)it);
	}
	size_t ranks[m];
	int64_t dims[m * FA_REC_MAXDIMS];
	for (int i = 0; i < m; i++) {
		ranks[i] = 1;
		dims[i * FA_REC_MAXDIMS] = n[i];
	}
	job_records(&j, rec, ranks, dims);
	job_free(&j);
	return 0;
}

// input_info reads input i of the kernel context and its type and shape
// (released by the caller); missing is the error for an absent input.
static OrtStatus *input_info(OrtKernelContext *ctx, size_t i, const char *missing, const OrtValue **v, OrtTensorTypeAndShapeInfo **info) {
	*v = NULL;
	*info = NULL;
	OrtStatus *st = ORTC_FN(api, ortc_KernelContext_GetInput)(ctx, i, v);
	if (st != NULL) {
		return st;
	}
	if (*v == NULL) {
		return fail(missing);
	}
	return ORTC_FN(api, ortc_GetTensorTypeAndShape)(*v, info);
}

// input reads input i of the kernel context: its data, element count and
// shape (the first FA_REC_MAXDIMS dimensions; rank is the full rank).
static OrtStatus *input(OrtKernelContext *ctx, size_t i, const float **data, int64_t *n, size_t *rank, int64_t *dims) {
	const OrtValue *v;
	OrtTensorTypeAndShapeInfo *info;
	OrtStatus *st = input_info(ctx, i, "fp16audit Observe: missing input", &v, &info);
	if (st != NULL) {
		return st;
	}
	int type = 0;
	size_t count = 0;
	st = ORTC_FN(api, ortc_GetTensorElementType)(info, &type);
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetDimensionsCount)(info, rank);
	}
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetTensorShapeElementCount)(info, &count);
	}
	if (st == NULL && *rank <= 64) {
		int64_t all[64];
		st = ORTC_FN(api, ortc_GetDimensions)(info, all, *rank);
		if (st == NULL) {
			memcpy(dims, all, sizeof(int64_t) * (*rank < FA_REC_MAXDIMS ? *rank : FA_REC_MAXDIMS));
		}
	}
	ORTC_RELEASE(api, ortc_ReleaseTensorTypeAndShapeInfo)(info);
	if (st != NULL) {
		return st;
	}
	if (type != ortc_float) {
		return fail("fp16audit Observe: input is not a float tensor");
	}
	*n = (int64_t)count;
	void *p = NULL;
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)((OrtValue *)v, &p)) != NULL) {
		return st;
	}
	*data = (const float *)p;
	return NULL;
}

// calls numbers the compute calls, so that the records show the order in
// which ONNX Runtime ran the ops.
static atomic_llong calls;

// sinks are the registered record buffers, by id - 1. A slot is claimed
// by a compare-and-swap on its buffer and cleared by fa_sink_free; a
// kernel reads it when it runs, while its session (and so the sink) is
// alive.
enum { max_sinks = 256 };
static struct {
	_Atomic(int64_t *) rec;
	atomic_llong nrec;
} sinks[max_sinks];

int64_t fa_sink_new(int64_t *rec, int64_t nrec) {
	for (int i = 0; i < max_sinks; i++) {
		int64_t *none = NULL;
		if (atomic_compare_exchange_strong(&sinks[i].rec, &none, rec)) {
			atomic_store(&sinks[i].nrec, nrec);
			return i + 1;
		}
	}
	return 0;
}

void fa_sink_free(int64_t id) {
	if (id >= 1 && id <= max_sinks) {
		atomic_store(&sinks[id - 1].nrec, 0);
		atomic_store(&sinks[id - 1].rec, NULL);
	}
}

// op_kernel is a node's state: its chunk length and where its records go.
typedef struct {
	int64_t chunk;
	int64_t sink, slot;
} op_kernel;

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
	int64_t seq = atomic_fetch_add(&calls, 1);
	size_t m = 0;
	OrtStatus *st = ORTC_FN(api, ortc_KernelContext_GetInputCount)(ctx, &m);
	if (st != NULL) {
		return st;
	}
	if (m < 2 || m > 65) {
		return fail("fp16audit Observe: wants a token and 1 to 64 values");
	}
	// Input 0 is the token; the values follow.
	m--;
	const op_kernel *k = (const op_kernel *)kernel;
	int64_t *sink = NULL;
	if (k->sink >= 1 && k->sink <= max_sinks) {
		sink = atomic_load(&sinks[k->sink - 1].rec);
		if (sink != NULL && (k->slot < 0 || k->slot + (int64_t)m > atomic_load(&sinks[k->sink - 1].nrec))) {
			sink = NULL;
		}
	}
	if (sink == NULL) {
		return fail("fp16audit Observe: no record sink for this node (the session's sink was freed or never registered)");
	}
	const float *x[m];
	int64_t n[m], dims[m * FA_REC_MAXDIMS];
	size_t ranks[m];
	memset(dims, 0, sizeof dims);
	for (size_t i = 0; i < m; i++) {
		if ((st = input(ctx, i + 1, &x[i], &n[i], &ranks[i], dims + i * FA_REC_MAXDIMS)) != NULL) {
			return st;
		}
	}
	int64_t out_dims[1] = {1};
	OrtValue *out = NULL;
	if ((st = ORTC_FN(api, ortc_KernelContext_GetOutput)(ctx, 0, out_dims, 1, &out)) != NULL) {
		return st;
	}
	void *p = NULL;
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)(out, &p)) != NULL) {
		return st;
	}
	*(float *)p = 0;
	job j;
	memset(&j, 0, sizeof j);
	j.m = (int)m;
	j.chunk = k->chunk;
	j.x = x;
	j.n = n;
	int64_t iters = job_alloc(&j);
	if (iters < 0) {
		job_free(&j);
		return fail("fp16audit Observe: out of memory");
	}
	if (iters > 1) {
		st = ORTC_FN(api, ortc_KernelContext_ParallelFor)(ctx, work, (size_t)iters, 0, &j);
	} else {
		work(&j, 0);
	}
	if (st == NULL) {
		int64_t *rec = sink + k->slot * FA_REC_LEN;
		job_records(&j, rec, ranks, dims);
		for (size_t i = 0; i < m; i++) {
			rec[i * FA_REC_LEN + FA_REC_SEQ] = seq;
		}
	}
	job_free(&j);
	return st;
}

// The OrtCustomOp callbacks: variadic float inputs (the token, then the
// values), one float output (the next token).
static const char *op_name(const ortc_custom_op *op) {
	(void)op;
	return FA_OP_OBSERVE;
}

static OrtStatus *create_kernel(const ortc_custom_op *op, const void *api_, const OrtKernelInfo *info, void **out) {
	(void)op;
	(void)api_;
	int64_t chunk = fa_chunk_len;
	OrtStatus *st = ORTC_FN(api, ortc_KernelInfoGetAttribute_int64)(info, FA_ATTR_CHUNK, &chunk);
	if (st != NULL) {
		// No attribute: the default.
		ORTC_RELEASE(api, ortc_ReleaseStatus)(st);
		chunk = fa_chunk_len;
	}
	if (chunk < 8 || chunk > ((int64_t)1 << 30)) {
		return fail("fp16audit Observe: chunk must be 8 to 2^30 elements");
	}
	int64_t sink = 0, slot = -1;
	if ((st = ORTC_FN(api, ortc_KernelInfoGetAttribute_int64)(info, FA_ATTR_SINK, &sink)) != NULL) {
		ORTC_RELEASE(api, ortc_ReleaseStatus)(st);
		return fail("fp16audit Observe: no sink attribute");
	}
	if ((st = ORTC_FN(api, ortc_KernelInfoGetAttribute_int64)(info, FA_ATTR_SLOT, &slot)) != NULL) {
		ORTC_RELEASE(api, ortc_ReleaseStatus)(st);
		return fail("fp16audit Observe: no slot attribute");
	}
	op_kernel *k = fa_malloc(sizeof *k);
	if (k == NULL) {
		return fail("fp16audit Observe: out of memory");
	}
	k->chunk = chunk;
	k->sink = sink;
	k->slot = slot;
	*out = k;
	return NULL;
}

static void destroy_kernel(void *k) { free(k); }
static const char *provider(const ortc_custom_op *op) {
	(void)op;
	return NULL; // the CPU execution provider
}
static int input_type(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_float;
}
static int output_type(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_float;
}
static size_t one_count(const ortc_custom_op *op) {
	(void)op;
	return 1;
}
static int variadic(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_io_variadic;
}
static int required(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_io_required;
}
static int mem_default(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_mem_default;
}
static int one(const ortc_custom_op *op) {
	(void)op;
	return 1;
}
static int two(const ortc_custom_op *op) {
	(void)op;
	return 2;
}

static ortc_custom_op observe_op = {
	.version = ortc_custom_op_version,
	.GetName = op_name,
	.GetExecutionProviderType = provider,
	.GetInputType = input_type,
	.GetInputTypeCount = one_count,
	.GetOutputType = output_type,
	.GetOutputTypeCount = one_count,
	.KernelDestroy = destroy_kernel,
	.GetInputCharacteristic = variadic,
	.GetOutputCharacteristic = required,
	.GetInputMemoryType = mem_default,
	.GetVariadicInputMinArity = two,
	.GetVariadicInputHomogeneity = one,
	.GetVariadicOutputMinArity = one,
	.GetVariadicOutputHomogeneity = one,
	.CreateKernelV2 = create_kernel,
	.KernelComputeV2 = compute,
};

// Round(x) -> y: x rounded to the format of the int attribute "to"
// (FLOAT16 or BFLOAT16) and back to float32, in chunks that ONNX Runtime's
// threads share.
typedef struct {
	int to;
	int alt; // the format when "on" is 2 (0: unrounded)
} round_kernel;

enum { round_chunk = 1 << 16 };

typedef struct {
	float *dst;
	const float *src;
	int64_t n;
	int to;
} round_job;

static void round_work(void *user, size_t it) {
	const round_job *j = (const round_job *)user;
	int64_t lo = (int64_t)it * round_chunk, hi = lo + round_chunk < j->n ? lo + round_chunk : j->n;
	if (j->to == 0) {
		memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo) * sizeof(float));
		return;
	}
	fa_round(j->dst + lo, j->src + lo, hi - lo, j->to);
}

// round_switch reads the optional input "on" of Round and Mass (its
// first element; 1 when absent).
static OrtStatus *round_switch(OrtKernelContext *ctx, float *on) {
	size_t n = 0;
	OrtStatus *st = ORTC_FN(api, ortc_KernelContext_GetInputCount)(ctx, &n);
	if (st != NULL || n < 2) {
		return st;
	}
	const OrtValue *v = NULL;
	if ((st = ORTC_FN(api, ortc_KernelContext_GetInput)(ctx, 1, &v)) != NULL || v == NULL) {
		return st;
	}
	void *p = NULL;
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)((OrtValue *)v, &p)) != NULL) {
		return st;
	}
	if (p != NULL) {
		*on = *(const float *)p;
	}
	return NULL;
}

// round_enabled sets *to to 0 when the input "on" is given and holds 0
// (Mass computes nothing).
static OrtStatus *round_enabled(OrtKernelContext *ctx, int *to) {
	float on = 1;
	OrtStatus *st = round_switch(ctx, &on);
	if (st == NULL && on == 0) {
		*to = 0;
	}
	return st;
}

static OrtStatus *round_compute(void *kernel, OrtKernelContext *ctx) {
	const OrtValue *v;
	OrtTensorTypeAndShapeInfo *info;
	OrtStatus *st = input_info(ctx, 0, "fp16audit Round: missing input", &v, &info);
	if (st != NULL) {
		return st;
	}
	size_t rank = 0, count = 0;
	int64_t dims[64] = {0};
	st = ORTC_FN(api, ortc_GetDimensionsCount)(info, &rank);
	if (st == NULL && rank > 64) {
		st = fail("fp16audit Round: input of rank above 64");
	}
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetDimensions)(info, dims, rank);
	}
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetTensorShapeElementCount)(info, &count);
	}
	ORTC_RELEASE(api, ortc_ReleaseTensorTypeAndShapeInfo)(info);
	if (st != NULL) {
		return st;
	}
	OrtValue *out = NULL;
	if ((st = ORTC_FN(api, ortc_KernelContext_GetOutput)(ctx, 0, dims, rank, &out)) != NULL) {
		return st;
	}
	void *src = NULL, *dst = NULL;
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)((OrtValue *)v, &src)) != NULL) {
		return st;
	}
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)(out, &dst)) != NULL) {
		return st;
	}
	const round_kernel *k = (const round_kernel *)kernel;
	round_job j = {(float *)dst, (const float *)src, (int64_t)count, k->to};
	// "on": 0 unrounded, 2 the alternative format, anything else "to"
	float on = 1;
	if ((st = round_switch(ctx, &on)) != NULL) {
		return st;
	}
	if (on == 0) {
		j.to = 0;
	} else if (on == 2) {
		j.to = k->alt;
	}
	int64_t iters = (j.n + round_chunk - 1) / round_chunk;
	if (iters > 1) {
		return ORTC_FN(api, ortc_KernelContext_ParallelFor)(ctx, round_work, (size_t)iters, 0, &j);
	}
	if (iters == 1) {
		round_work(&j, 0);
	}
	return NULL;
}

static const char *round_name(const ortc_custom_op *op) {
	(void)op;
	return FA_OP_ROUND;
}

static OrtStatus *round_create(const ortc_custom_op *op, const void *api_, const OrtKernelInfo *info, void **out) {
	(void)op;
	(void)api_;
	int64_t to = 0;
	OrtStatus *st = ORTC_FN(api, ortc_KernelInfoGetAttribute_int64)(info, FA_ATTR_TO, &to);
	if (st != NULL) {
		ORTC_RELEASE(api, ortc_ReleaseStatus)(st);
		return fail("fp16audit Round: no \"to\" attribute");
	}
	if (to != FA_ROUND_FP16 && to != FA_ROUND_BF16) {
		return fail("fp16audit Round: \"to\" must be FLOAT16 (10) or BFLOAT16 (16)");
	}
	int64_t alt = to;
	if ((st = ORTC_FN(api, ortc_KernelInfoGetAttribute_int64)(info, FA_ATTR_ALT, &alt)) != NULL) {
		ORTC_RELEASE(api, ortc_ReleaseStatus)(st);
		alt = to;
	}
	if (alt != 0 && alt != FA_ROUND_FP16 && alt != FA_ROUND_BF16) {
		return fail("fp16audit Round: \"alt\" must be 0, FLOAT16 (10) or BFLOAT16 (16)");
	}
	round_kernel *k = fa_malloc(sizeof *k);
	if (k == NULL) {
		return fail("fp16audit Round: out of memory");
	}
	k->to = (int)to;
	k->alt = (int)alt;
	*out = k;
	return NULL;
}

// Mass(x) -> h: the exponent histogram of x (ops.h), in chunks that ONNX
// Runtime's threads share, each into its own row, added in chunk order so
// that the sums do not depend on the threads.
enum { mass_chunk = 1 << 16 };

typedef struct {
	const float *x;
	int64_t n;
	double *rows; // [chunks][FA_MASS_LEN]
} mass_job;

// mass_lanes is the number of histograms mass_rows keeps: neighbouring
// elements mostly share an exponent, and with one histogram every add
// would wait for the store of the previous element's add to the same slot
// (measured 5x slower than with four).
enum { mass_lanes = 4 };

// mass_rows writes Mass(x[0:n]) into h; n is at most mass_chunk. Element i
// goes to histogram i % mass_lanes; the histograms are added in lane order
// at the end, so the sums do not depend on anything but x.
static void mass_rows(const float *x, int64_t n, double *h) {
	uint32_t cnt[mass_lanes][FA_MASS_BUCKETS];
	double sq[mass_lanes][FA_MASS_BUCKETS];
	memset(cnt, 0, sizeof cnt);
	memset(sq, 0, sizeof sq);
	float mx[mass_lanes] = {0};
	int64_t i = 0;
	for (; i + mass_lanes <= n; i += mass_lanes) {
		for (int l = 0; l < mass_lanes; l++) {
			uint32_t b;
			memcpy(&b, &x[i + l], sizeof b);
			uint32_t e = (b >> 23) & 0xff;
			b &= 0x7fffffffu;
			float a;
			memcpy(&a, &b, sizeof a);
			cnt[l][e]++;
			// Bucket 0xff holds NaN and Inf: counted, never summed.
			sq[l][e] += e == 0xff ? 0.0 : (double)a * (double)a;
			mx[l] = e != 0xff && a > mx[l] ? a : mx[l];
		}
	}
	for (int l = 0; i < n; i++, l++) {
		uint32_t b;
		memcpy(&b, &x[i], sizeof b);
		uint32_t e = (b >> 23) & 0xff;
		b &= 0x7fffffffu;
		float a;
		memcpy(&a, &b, sizeof a);
		cnt[l][e]++;
		sq[l][e] += e == 0xff ? 0.0 : (double)a * (double)a;
		mx[l] = e != 0xff && a > mx[l] ? a : mx[l];
	}
	memset(h, 0, FA_MASS_LEN * sizeof(double));
	float m = 0;
	for (int l = 0; l < mass_lanes; l++) {
		for (int e = 0; e < 0xff; e++) {
			h[e] += (double)cnt[l][e];
			h[FA_MASS_SUMSQ + e] += sq[l][e];
		}
		h[FA_MASS_NONFINITE] += (double)cnt[l][0xff];
		m = mx[l] > m ? mx[l] : m;
	}
	h[FA_MASS_MAX] = m;
}

static void mass_work(void *user, size_t it) {
	const mass_job *j = (const mass_job *)user;
	int64_t lo = (int64_t)it * mass_chunk, hi = lo + mass_chunk < j->n ? lo + mass_chunk : j->n;
	mass_rows(j->x + lo, hi - lo, j->rows + (size_t)it * FA_MASS_LEN);
}

// mass_fold adds rows 1..k-1 into row 0 in order.
static void mass_fold(double *rows, int64_t k) {
	for (int64_t c = 1; c < k; c++) {
		const double *r = rows + (size_t)c * FA_MASS_LEN;
		for (int i = 0; i < FA_MASS_MAX; i++) {
			rows[i] += r[i];
		}
		rows[FA_MASS_MAX] = r[FA_MASS_MAX] > rows[FA_MASS_MAX] ? r[FA_MASS_MAX] : rows[FA_MASS_MAX];
		rows[FA_MASS_NONFINITE] += r[FA_MASS_NONFINITE];
	}
}

void fa_mass(const float *x, int64_t n, double *h) {
	int64_t k = (n + mass_chunk - 1) / mass_chunk;
	if (k <= 1) {
		mass_rows(x, n, h);
		return;
	}
	double row[FA_MASS_LEN], acc[FA_MASS_LEN];
	for (int64_t c = 0; c < k; c++) {
		int64_t lo = c * mass_chunk, hi = lo + mass_chunk < n ? lo + mass_chunk : n;
		mass_rows(x + lo, hi - lo, c == 0 ? acc : row);
		if (c > 0) {
			for (int i = 0; i < FA_MASS_MAX; i++) {
				acc[i] += row[i];
			}
			acc[FA_MASS_MAX] = row[FA_MASS_MAX] > acc[FA_MASS_MAX] ? row[FA_MASS_MAX] : acc[FA_MASS_MAX];
			acc[FA_MASS_NONFINITE] += row[FA_MASS_NONFINITE];
		}
	}
	memcpy(h, acc, sizeof acc);
}

static OrtStatus *mass_compute(void *kernel, OrtKernelContext *ctx) {
	(void)kernel;
	const OrtValue *v;
	OrtTensorTypeAndShapeInfo *info;
	OrtStatus *st = input_info(ctx, 0, "fp16audit Mass: missing input", &v, &info);
	if (st != NULL) {
		return st;
	}
	size_t count = 0;
	st = ORTC_FN(api, ortc_GetTensorShapeElementCount)(info, &count);
	ORTC_RELEASE(api, ortc_ReleaseTensorTypeAndShapeInfo)(info);
	if (st != NULL) {
		return st;
	}
	int64_t dims[1] = {FA_MASS_LEN};
	OrtValue *out = NULL;
	if ((st = ORTC_FN(api, ortc_KernelContext_GetOutput)(ctx, 0, dims, 1, &out)) != NULL) {
		return st;
	}
	void *src = NULL, *dst = NULL;
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)((OrtValue *)v, &src)) != NULL) {
		return st;
	}
	if ((st = ORTC_FN(api, ortc_GetTensorMutableData)(out, &dst)) != NULL) {
		return st;
	}
	int on = 1;
	if ((st = round_enabled(ctx, &on)) != NULL) {
		return st;
	}
	if (on == 0) {
		// Switched off: a run whose histograms nobody reads (the backward
		// audit's rounded runs) skips the pass over x.
		memset(dst, 0, FA_MASS_LEN * sizeof(double));
		return NULL;
	}
	int64_t n = (int64_t)count, k = (n + mass_chunk - 1) / mass_chunk;
	if (k <= 1) {
		mass_rows((const float *)src, n, (double *)dst);
		return NULL;
	}
	mass_job j = {(const float *)src, n, fa_malloc((size_t)k * FA_MASS_LEN * sizeof(double))};
	if (j.rows == NULL) {
		return fail("fp16audit Mass: out of memory");
	}
	st = ORTC_FN(api, ortc_KernelContext_ParallelFor)(ctx, mass_work, (size_t)k, 0, &j);
	if (st == NULL) {
		mass_fold(j.rows, k);
		memcpy(dst, j.rows, FA_MASS_LEN * sizeof(double));
	}
	free(j.rows);
	return st;
}

static const char *mass_name(const ortc_custom_op *op) {
	(void)op;
	return FA_OP_MASS;
}

static OrtStatus *mass_create(const ortc_custom_op *op, const void *api_, const OrtKernelInfo *info, void **out) {
	(void)op;
	(void)api_;
	(void)info;
	*out = fa_malloc(1);
	return *out == NULL ? fail("fp16audit Mass: out of memory") : NULL;
}

static int double_type(const ortc_custom_op *op, size_t i) {
	(void)op;
	(void)i;
	return ortc_double;
}

// round_input is required for x and optional for on.
static int round_input(const ortc_custom_op *op, size_t i) {
	(void)op;
	return i == 0 ? ortc_io_required : ortc_io_optional;
}

static size_t two_count(const ortc_custom_op *op) {
	(void)op;
	return 2;
}

// round_op and mass_op are observe_op with their own names, kernels and
// inputs; fa_ops_init fills them in.
static ortc_custom_op round_op, mass_op;

void fa_ops_init(const void *table, const void **ops) {
	api = table;
	round_op = observe_op;
	round_op.GetName = round_name;
	round_op.GetInputTypeCount = two_count;
	round_op.GetInputCharacteristic = round_input;
	round_op.GetVariadicInputMinArity = one;
	round_op.CreateKernelV2 = round_create;
	round_op.KernelComputeV2 = round_compute;
	mass_op = observe_op;
	mass_op.GetName = mass_name;
	mass_op.GetInputTypeCount = two_count;
	mass_op.GetInputCharacteristic = round_input;
	mass_op.GetVariadicInputMinArity = one;
	mass_op.GetOutputType = double_type;
	mass_op.CreateKernelV2 = mass_create;
	mass_op.KernelComputeV2 = mass_compute;
	ops[0] = &observe_op;
	ops[1] = &round_op;
	ops[2] = &mass_op;
}
